"""Generated agent tasks: problems a model can only solve by calling tools.

``agent-shop``: a shopper buys three items in given quantities; the unit prices are not
in the question, only behind a ``get_price`` tool. A task is solved when the final answer
is the total. Each task is generated from its index alone (a seeded random generator), so
a run, its resume and a later reader see the same prices; no task comes from a data set
anyone trained or tuned on. The question itself names the tool: the task is the user's
message, with no system prompt (the bundled pair calls the tool on such a message, and
reasons its way around it under a system prompt asking for tools).

Worked example (task 0)::

    >>> task = shop_task(0)
    >>> task.question[:73]
    'Diego buys 3 glue sticks, 6 rulers and 4 staplers at the school store. Lo'
    >>> task.prices
    {'glue stick': 28, 'ruler': 24, 'stapler': 17}
    >>> task.answer  # 3 * 28 + 6 * 24 + 4 * 17
    296

The model's loop: call ``get_price("glue stick")`` and read "One glue stick costs $28.",
likewise the ruler and the stapler (a turn each), then reason to the total, 296.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SHOP_SIZE = 200  # tasks in the set; a run picks some with --offset/--limit
ITEMS = ("notebook", "pencil", "eraser", "ruler", "stapler", "backpack", "marker", "folder", "glue stick",
         "calculator", "binder", "highlighter", "crayon box", "lunch box", "water bottle", "pen", "sketchbook",
         "paint set", "protractor", "compass")
NAMES = (("Omar", "he"), ("Maya", "she"), ("Lena", "she"), ("Ravi", "he"), ("Sofia", "she"), ("Tom", "he"),
         ("Aiko", "she"), ("Diego", "he"), ("Nora", "she"), ("Kwame", "he"))

@dataclass(frozen=True)
class ShopTask:
    index: int
    question: str
    prices: dict[str, int]  # unit price per item, in dollars: what get_price answers
    quantities: dict[str, int]

    @property
    def answer(self) -> int:
        return sum(self.prices[item] * n for item, n in self.quantities.items())

    def price(self, item: str) -> str:
        """What the ``get_price`` tool answers for ``item`` (a plural or other case is read too)."""
        key = item.strip().lower()
        for name in self.prices:
            if key in (name, name + "s", name + "es"):
                return f"One {name} costs ${self.prices[name]}."
        return f"No item called '{item}' in this store; its items: {', '.join(self.prices)}."


def _plural(item: str, n: int) -> str:
    if n == 1:
        return f"1 {item}"
    return f"{n} {item}es" if item.endswith(("s", "x", "sh", "ch")) else f"{n} {item}s"


def shop_task(index: int) -> ShopTask:
    """Task ``index`` of ``agent-shop``: three items, quantities 2-9, prices $2-$40."""
    rng = random.Random(f"agent-shop-{index}")
    items = rng.sample(ITEMS, 3)
    quantities = {item: rng.randint(2, 9) for item in items}
    prices = {item: rng.randint(2, 40) for item in items}
    name, pronoun = rng.choice(NAMES)
    bought = [_plural(item, n) for item, n in quantities.items()]
    listing = f"{bought[0]}, {bought[1]} and {bought[2]}"
    question = (f"{name} buys {listing} at the school store. Look up the prices with the get_price tool. How "
                f"much does {pronoun} pay in total, in dollars?")
    return ShopTask(index, question, prices, quantities)


TASK_SETS = {"agent-shop": (shop_task, SHOP_SIZE)}  # name: (the task of an index, how many)
