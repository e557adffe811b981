#!/usr/bin/env bash
# Older SGLang releases for the version-matrix tests, as overlays on the CPU server environment.
#
#   bash scripts/make_sglang_overlays.sh [VERSION ...]     # default: 0.5.14 0.5.19 0.5.5
#
# Each release is installed with --no-deps into .sglang-venv/overlays/<version>/ together with the
# transformers/tokenizers/huggingface_hub it pins (they differ from the base env's 0.5.23 set; 0.5.5 also
# imports torchao at model load, whatever the quantization), and
# .sglang-venv/bin/python-<version> runs the base interpreter with that overlay first on the path. Everything
# else (the CPU torch, sglang's other imports, the CPU support files) is the base environment's: make sglang-env
# first. Idempotent: a stamp keyed by this script's hash and the version skips an overlay already built.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HS_SGLANG_VENV:-$REPO/.sglang-venv}"
VERSIONS="${*:-0.5.14 0.5.19 0.5.5}"
[[ -x "$VENV/bin/python" ]] || { echo "sglang-overlays: $VENV missing: run make sglang-env first" >&2; exit 2; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

pins_for() {  # what each release pins that the base env (sglang 0.5.23, transformers 5.19) has otherwise
  case "$1" in
    0.5.14) echo "transformers==5.8.1 tokenizers==0.22.2 huggingface_hub==1.16.0" ;;
    0.5.19) echo "transformers==5.12.1 tokenizers==0.22.2 huggingface_hub==1.16.0" ;;
    0.5.5) echo "transformers==4.57.1 tokenizers==0.22.2 huggingface_hub==0.36.0 torchao==0.9.0" ;;
    *) echo "sglang-overlays: no pins known for sglang $1" >&2; return 2 ;;
  esac
}

for v in $VERSIONS; do
  dir="$VENV/overlays/$v"
  key="$( (cat "${BASH_SOURCE[0]}"; echo "$v") | sha256sum | cut -c1-32)"
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$key" && -x "$VENV/bin/python-$v" ]]; then
    echo "sglang-overlays: $v is up to date"; continue
  fi
  pins="$(pins_for "$v")"
  rm -rf "$dir" && mkdir -p "$dir"
  # shellcheck disable=SC2086
  "${PIP[@]}" install -q --no-deps --target "$dir" "sglang==$v" $pins
  rm -rf "$dir/bin"
  cat > "$VENV/bin/python-$v" <<SH
#!/usr/bin/env bash
# The CPU server environment with sglang $v first on the path (scripts/make_sglang_overlays.sh).
export PYTHONPATH="$dir\${PYTHONPATH:+:\$PYTHONPATH}"
exec "$VENV/bin/python" "\$@"
SH
  chmod +x "$VENV/bin/python-$v"
  got="$("$VENV/bin/python-$v" -c 'import importlib.metadata as m; print(m.version("sglang"))')"
  [[ "$got" == "$v" ]] || { echo "sglang-overlays: python-$v imports sglang $got" >&2; exit 1; }
  echo "$key" > "$dir/.stamp"
  echo "sglang-overlays: $v ready ($VENV/bin/python-$v)"
done
