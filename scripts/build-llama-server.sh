#!/usr/bin/env bash
# Builds llama.cpp's own server (`llama-server`) from the llama.cpp sources that PyPI's
# llama-cpp-python sdist vendors, with CMake from PyPI, into .llama-server/ (once; about ten
# minutes on two cores). `just bench-serving` measures it beside the embedded server.
#
# Exits 0 with .llama-server/bin/llama-server in place, or non-zero saying what is missing
# (no compiler, no registry): the caller then skips the comparison and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.3.36
dest=.llama-server
if [ -x "$dest/bin/llama-server" ]; then
  exit 0
fi
for tool in cc c++ make python3; do
  command -v "$tool" >/dev/null || { echo "llama-server: \`$tool\` is missing; install a C/C++ toolchain and Python 3" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "llama-server: fetching llama-cpp-python $version (sdist) and CMake" >&2
python3 -m venv "$work/venv"
# The sdist's own build backend, so that pip reads its metadata without building the backend's
# build dependencies (CMake among them) from source first.
"$work/venv/bin/pip" install -q cmake scikit-build-core
"$work/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation -d "$work" "llama-cpp-python==$version"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "llama-server: the sdist has no vendor/llama.cpp" >&2; exit 1; }

echo "llama-server: building (about ten minutes on two cores)" >&2
# Native CPU code, like the binding `just bench` builds; no network features.
"$work/venv/bin/cmake" -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
"$work/venv/bin/cmake" --build "$work/build" --target llama-server -j "$(nproc)" >&2

mkdir -p "$dest.partial/bin"
cp "$work/build/bin/llama-server" "$dest.partial/bin/"
# Shared libraries, when the build made them, beside the binary (its rpath is the build tree).
find "$work/build" -name '*.so*' -exec cp -P {} "$dest.partial/bin/" \; 2>/dev/null || true
echo "$version" > "$dest.partial/llama-cpp-python-version"
(cd "$src" && git rev-parse HEAD 2>/dev/null || true) > "$dest.partial/llama-cpp-commit"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "llama-server: built into $dest/bin" >&2
