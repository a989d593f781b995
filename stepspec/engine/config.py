"""An engine's settings, declared once, and the one function that builds an engine from them.

* :class:`TokenSpeculation`: token-level speculation inside one engine, by method name.
* :class:`VLLMEngineConfig` (``backend: vllm``): an in-process vLLM engine.
* :class:`OpenAIEngineConfig` (``backend: openai``): an OpenAI-compatible server.
* :data:`EngineConfig`: either, told apart by ``backend`` (YAML workflow files' ``engines:``).
* :class:`EnginePair`: the flat settings of a target and a draft as the front ends take them
  (``stepspec solve``/``bench``/``router collect`` flags, lm-eval's model_args,
  ``Reasoner.from_models``); :meth:`EnginePair.engines` turns them into two engine configs.
* :func:`build_engine`: an engine (not started) from a config. Nothing else builds one.

Every model here is frozen and refuses unknown keys; every field's default is written
once, here, with a description (the command line's defaults and help come from them).
Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Union

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from stepspec.common.options import Frozen
from stepspec.common.states import Author
from stepspec.engine.dtype import Dtype
from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, ModelError, resolve_model
from stepspec.engine.speculation import AUTO_SPEC, METHODS, TokenMethod, speculative_config
from stepspec.engine.session import DEFAULT_SESSION_HEADER
from stepspec.engine.token_accept import AcceptRule

if TYPE_CHECKING:
    from stepspec.engine.models import PrepareProgress
    from stepspec.engine.protocol import Engine


def like(model: type[BaseModel], name: str, **changes: Any) -> Any:
    """A field declared as ``model``'s field ``name`` is: the same default (or factory),
    bounds and description, with ``changes`` (e.g. another description). For models that
    take the same setting under their own name, without writing its default again."""
    src = model.model_fields[name]
    bounds = {type(m).__name__.lower(): getattr(m, type(m).__name__.lower())
              for m in src.metadata if isinstance(m, (Ge, Gt, Le, Lt))}
    default = {"default_factory": src.default_factory} if src.default_factory else {"default": src.default}
    return Field(**{**default, "description": src.description, **bounds, **changes})


def _unset(value: Any) -> bool:
    return value is None


# -- token-level speculation ----------------------------------------------------------


class TokenSpeculation(Frozen):
    """Token-level speculative decoding inside one vLLM engine, by method name."""

    method: TokenMethod = Field(TokenMethod.NONE.value, description="none; ngram (prompt lookup); suffix (suffix "
                                "decoding, needs arctic-inference); draft (a smaller model of the same tokenizer: "
                                "draft_model).")
    num_speculative_tokens: int | None = Field(None, ge=1, description="Tokens proposed per token-level draft "
                                               "(default: the method's: ngram 3, suffix 8, draft 3).")
    draft_model: str | None = Field(None, description="Token-level drafter for method draft (preset, path or hub id).")

    @model_validator(mode="after")
    def _drafter(self) -> "TokenSpeculation":
        if self.method == TokenMethod.DRAFT and not self.draft_model:
            raise ValueError("speculation: draft needs draft_model (the model that drafts tokens)")
        return self

    def vllm_config(self, on_prepare: PrepareProgress | None = None) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` (the token drafter resolved, prepared if need be)."""
        drafter = resolve_model(self.draft_model, on_progress=on_prepare) if self.method == TokenMethod.DRAFT else None
        return speculative_config(self.method, draft_model=drafter,
                                  num_speculative_tokens=self.num_speculative_tokens)


# -- engines ----------------------------------------------------------------------------


class VLLMEngineConfig(Frozen):
    """An in-process vLLM engine."""

    backend: Literal["vllm"] = "vllm"
    model: str = Field(description="Model preset (stepspec models list), local folder or hub id.")
    dtype: Dtype = Field("auto", description="What the engine computes in: auto (the fastest on this machine: on a "
                         "CPU bfloat16 where it has native bf16 and a timed probe confirms it, else float32; on a GPU "
                         "vLLM's choice), bfloat16, float16, float32.")
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache size of the engine, GiB.")
    max_model_len: int = Field(4096, ge=256, description="Context window of the engine, tokens.")
    max_num_seqs: int = Field(32, ge=1, description="Sequences the engine decodes in one batch.")
    speculative_config: dict[str, Any] | None = Field(
        None, description="Passed to vLLM as it is (e.g. {method: ngram, num_speculative_tokens: 3}).")
    speculation: TokenMethod | None = Field(None, description="Shorthand for speculative_config; 'draft' uses "
                                            "draft_model.")
    draft_model: str | None = like(TokenSpeculation, "draft_model")
    num_speculative_tokens: int | None = like(TokenSpeculation, "num_speculative_tokens", exclude_if=_unset)
    accept: AcceptRule | None = Field(None, exclude_if=_unset, description="Which proposed tokens the engine's "
                                      "token-level speculation keeps for a greedy request (stepspec.engine."
                                      "token_accept); None: the target's greedy token only, vLLM's own rule.")

    @model_validator(mode="after")
    def _one_speculation(self) -> "VLLMEngineConfig":
        if self.speculative_config is not None and self.speculation is not None:
            raise ValueError("give speculative_config or speculation, not both")
        if self.accept is not None and self.speculative_config is None and self.speculation is None:
            raise ValueError("accept judges the proposals of token-level speculation, and this engine has none: "
                             "set speculation (e.g. draft) or leave accept out")
        if self.speculation == TokenMethod.DRAFT and not self.draft_model:
            raise ValueError("speculation: draft needs draft_model (the model that drafts tokens)")
        return self

    @property
    def token_speculation(self) -> TokenSpeculation | None:
        """The ``speculation`` shorthand as a declaration (None: none, or a raw speculative_config)."""
        if self.speculation is None:
            return None
        return TokenSpeculation(method=self.speculation, num_speculative_tokens=self.num_speculative_tokens,
                                draft_model=self.draft_model if self.speculation == TokenMethod.DRAFT else None)

    def models(self) -> dict[tuple[str, ...], str]:
        """Every model the engine loads, by the key that names it: the model and its token drafter."""
        found = {("model",): self.model}
        if self.draft_model:
            found[("draft_model",)] = self.draft_model
        if (self.speculative_config or {}).get("model"):  # a preset name, like draft_model
            found[("speculative_config", "model")] = self.speculative_config["model"]
        return found


class OpenAIEngineConfig(Frozen):
    """An OpenAI-compatible server (vLLM's ``vllm serve``, SGLang, ...)."""

    backend: Literal["openai"] = "openai"
    base_url: str = Field(description="The server's OpenAI-compatible URL, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="The model name the server serves.")
    api_key_env: str | None = Field(None, description="Name of the environment variable holding the API key.")
    tokenizer: str | None = Field(None, description="The served model's tokenizer (local path or hub id), when "
                                  "this machine lacks the server's own.")
    max_model_len: int | None = Field(None, description="The server's context window (default: as it reports).")
    timeout_s: float = Field(120.0, gt=0, description="Seconds per HTTP request.")
    session_header: str | None = Field(DEFAULT_SESSION_HEADER, description="The header that carries a trace's "
                                       "session id on every request (a prefix-aware router keeps a trace on one "
                                       "replica by it); None: no header.")

    @model_validator(mode="before")
    @classmethod
    def _no_literal_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError("a literal api_key does not belong in a workflow file; put the key in an "
                             "environment variable and name it with api_key_env: OPENAI_API_KEY")
        return data

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"api_key_env must name an environment variable (like OPENAI_API_KEY), not {v[:4]}...; "
                             "never put the key itself in the file")
        return v


EngineConfig = Annotated[Union[VLLMEngineConfig, OpenAIEngineConfig], Field(discriminator="backend")]


def check_model(model: str) -> None:
    """A model string resolves, loading and preparing nothing: an unknown one raises
    :class:`stepspec.engine.models.ModelError` (with the closest preset); a preset not prepared yet
    passes (it is prepared when its engine is built)."""
    try:
        resolve_model(model, auto_prepare=False)
    except ModelError as e:
        if "is not prepared" not in str(e):
            raise


def check_engine(config: VLLMEngineConfig | OpenAIEngineConfig) -> None:
    """Every model a vLLM engine would load resolves (:func:`check_model`)."""
    if isinstance(config, VLLMEngineConfig):
        for model in config.models().values():
            check_model(model)


def build_engine(name: str, config: VLLMEngineConfig | OpenAIEngineConfig, *,
                 on_prepare: PrepareProgress | None = None) -> Engine:
    """The engine a config describes, named ``name``, not started. A vLLM engine's models
    are resolved here (a bundled preset prepared first; ``on_prepare`` hears its progress)."""
    if isinstance(config, OpenAIEngineConfig):
        from stepspec.engine.openai_backend import OpenAIEngine

        return OpenAIEngine(config.base_url, config.model, name=name, api_key_env=config.api_key_env,
                            timeout_s=config.timeout_s, max_model_len=config.max_model_len,
                            tokenizer=config.tokenizer, session_header=config.session_header)
    from stepspec.engine.vllm_backend import VLLMEngine

    check_engine(config)  # an unknown token drafter fails before the model is prepared
    spec_config = config.speculative_config
    if config.token_speculation is not None:
        spec_config = config.token_speculation.vllm_config(on_prepare)
    elif spec_config and "model" in spec_config:  # a preset name for the token drafter
        spec_config = {**spec_config, "model": resolve_model(spec_config["model"], on_progress=on_prepare)}
    return VLLMEngine(resolve_model(config.model, on_progress=on_prepare), name=name, dtype=config.dtype,
                      kv_cache_gib=config.kv_cache_gib, max_model_len=config.max_model_len,
                      max_num_seqs=config.max_num_seqs, speculative_config=spec_config, accept=config.accept)


def build_engines(configs: Mapping[str, VLLMEngineConfig | OpenAIEngineConfig], *,
                  names: Mapping[str, str] | None = None,
                  on_prepare: PrepareProgress | None = None) -> dict[str, Engine]:
    """:func:`build_engine` for each config (``names``: the engines' names by key; default the
    keys), servers first: each is asked once whether it answers (its start, in a worker
    thread), so a URL that does not answer fails in seconds, before any model is prepared.
    Returns the engines, not started, in the order of ``configs``."""
    built: dict[str, Engine] = {}
    for key in sorted(configs, key=lambda k: not isinstance(configs[k], OpenAIEngineConfig)):
        built[key] = build_engine((names or {}).get(key, key), configs[key], on_prepare=on_prepare)
        if isinstance(configs[key], OpenAIEngineConfig):
            _check_answers(built[key])
    return {key: built[key] for key in configs}


def _check_answers(engine: Engine) -> None:
    async def start_and_close() -> None:
        await engine.start()
        await engine.close()

    with ThreadPoolExecutor(1) as pool:  # its own event loop, whether or not this thread runs one
        pool.submit(asyncio.run, start_and_close()).result()


# -- the pair the front ends take -------------------------------------------------------


class EnginePair(Frozen):
    """A target and a draft, flat, as every front end takes them. :meth:`engines` gives
    their engine configs: an in-process vLLM engine each, or an OpenAI-compatible server
    where a URL is given (the model is then the name the server serves; the in-process
    settings, token-level speculation included, do not apply to it)."""

    target: str = Field(BUNDLED_TARGET, description="Target model: preset, local path or hub id (with a target "
                        "URL: the model name its server serves).")
    draft: str | None = Field(BUNDLED_DRAFT, description="Draft model: preset, local path or hub id (with a draft "
                              "URL: the model name its server serves).")
    # The draft's default: the 0.5B decodes fastest with suffix decoding; the target's method
    # depends on what the strategy has it do
    # (stepspec.orchestrator.strategies.Strategy.target_spec).
    target_spec: TokenMethod | Literal["auto"] = Field(
        AUTO_SPEC, description="Token-level speculation inside the target: auto (the "
                             "strategy's own: draft where the target writes most of the trace, suffix where it "
                             "mostly verifies drafted steps), none, ngram, suffix, draft (the draft model drafts "
                             "the target's tokens; none when the draft is not an in-process model).")
    draft_spec: TokenMethod = Field(TokenMethod.SUFFIX.value, description="Token-level speculation inside the draft: "
                                    "none, ngram, suffix.")
    target_dtype: Dtype = like(VLLMEngineConfig, "dtype", description="What the target's in-process engine computes "
                               "in: auto (the fastest on this machine, measured), bfloat16, float16, float32.")
    draft_dtype: Dtype = like(VLLMEngineConfig, "dtype", description="What the draft's in-process engine computes "
                              "in: auto (the fastest on this machine, measured), bfloat16, float16, float32.")
    num_speculative_tokens: int | None = like(TokenSpeculation, "num_speculative_tokens")
    target_accept: AcceptRule | None = like(VLLMEngineConfig, "accept", description="Which of its token-level "
                                            "proposals the target keeps (stepspec.engine.token_accept, e.g. "
                                            "{max_rank: 2, floor: -3, math_max_rank: 1}); None: its greedy token "
                                            "only, the exact rule.")
    kv_cache_gib: float = like(VLLMEngineConfig, "kv_cache_gib", description="KV cache size of each engine, GiB.")
    max_model_len: int = like(VLLMEngineConfig, "max_model_len", description="Context window of each engine, "
                              "tokens.")
    max_num_seqs: int = like(VLLMEngineConfig, "max_num_seqs", description="Sequences each engine decodes in one "
                             "batch.")
    target_url: str | None = Field(None, exclude_if=_unset, description="Run the target on this OpenAI-compatible "
                                   "server (e.g. http://127.0.0.1:8000/v1) instead of in-process vLLM.")
    draft_url: str | None = Field(None, exclude_if=_unset, description="Run the draft on this OpenAI-compatible "
                                  "server instead of in-process vLLM.")
    api_key_env: str | None = like(OpenAIEngineConfig, "api_key_env", exclude_if=_unset,
                                   description="Environment variable holding the servers' API key.")
    session_header: str | None = like(OpenAIEngineConfig, "session_header",
                                      exclude_if=lambda v: v == DEFAULT_SESSION_HEADER,
                                      description="The header carrying each trace's session id on every request "
                                      "to the servers (a prefix-aware router keeps a trace on one replica by it).")

    @field_validator("target_spec", "draft_spec", mode="before")
    @classmethod
    def _known_method(cls, value: str, info: ValidationInfo) -> str:
        known = (AUTO_SPEC, *METHODS) if info.field_name == "target_spec" else METHODS
        if value not in known:
            raise ValueError(f"unknown speculation method '{value}'; choose one of: {', '.join(known)}")
        return value

    @model_validator(mode="after")
    def _fits(self) -> "EnginePair":
        if self.draft_spec == TokenMethod.DRAFT:
            raise ValueError("draft_spec='draft' would need a third, smaller model; use none, ngram or suffix")
        for role, url, method in ((Author.TARGET, self.target_url, self.target_spec),
                                  (Author.DRAFT, self.draft_url, self.draft_spec)):
            if url and method in (TokenMethod.NGRAM, TokenMethod.SUFFIX):
                raise ValueError(f"{role}_spec='{method}' runs inside an in-process vLLM engine; the {role}'s server "
                                 f"({url}) speculates as it was started (vllm serve --speculative-config ...)")
        for role, url, dtype in ((Author.TARGET, self.target_url, self.target_dtype),
                                 (Author.DRAFT, self.draft_url, self.draft_dtype)):
            if url and dtype != "auto":
                raise ValueError(f"{role}_dtype='{dtype}' sets an in-process vLLM engine; the {role}'s server ({url}) "
                                 "computes in the dtype it was started with (vllm serve --dtype ...)")
        if self.draft_url and not self.draft:
            raise ValueError("draft_url is given without a draft model: name the model its server serves")
        return self

    def engines(self, auto_target_spec: TokenMethod = TokenMethod.DRAFT
                ) -> tuple[VLLMEngineConfig | OpenAIEngineConfig, VLLMEngineConfig | OpenAIEngineConfig | None]:
        """(target, draft) engine configs; draft None when there is no draft model.
        ``auto_target_spec``: what ``target_spec="auto"`` means (the strategy's own method)."""
        in_process_draft = self.draft if self.draft and not self.draft_url else None
        method = auto_target_spec if self.target_spec == AUTO_SPEC else self.target_spec
        target_method = method if method != TokenMethod.DRAFT or in_process_draft else TokenMethod.NONE
        target = self._engine(self.target, self.target_url, target_method, in_process_draft, self.target_dtype)
        if self.target_accept is not None:
            if not isinstance(target, VLLMEngineConfig) or target.speculation is None:
                raise ValueError("target_accept judges the target's token-level proposals, and the target has none "
                                 f"(target_spec {target_method}, url {self.target_url}): give an in-process target "
                                 "with target_spec draft, ngram or suffix, or leave target_accept out")
            target = target.model_copy(update={"accept": self.target_accept})
        return target, (self._engine(self.draft, self.draft_url, self.draft_spec, None, self.draft_dtype)
                        if self.draft else None)

    def _engine(self, model: str, url: str | None, method: TokenMethod, drafter: str | None,
                dtype: str) -> VLLMEngineConfig | OpenAIEngineConfig:
        if url:
            return OpenAIEngineConfig(base_url=url, model=model, api_key_env=self.api_key_env,
                                      session_header=self.session_header)
        speculating = method != TokenMethod.NONE
        return VLLMEngineConfig(model=model, dtype=dtype, kv_cache_gib=self.kv_cache_gib, max_model_len=self.max_model_len,
                                max_num_seqs=self.max_num_seqs, speculation=method if speculating else None,
                                draft_model=drafter if method == TokenMethod.DRAFT else None,
                                num_speculative_tokens=self.num_speculative_tokens if speculating else None)
