#!/usr/bin/env bash
# wasm-c.sh builds the C example modules (plugins/c) to WebAssembly with
# clang, lld and wasi-libc, the second guest language of the examples.
#
#   scripts/wasm-c.sh check            exit 0 if the toolchain is present
#   scripts/wasm-c.sh ensure           install it if missing (apt-get, as
#                                      root); otherwise fail saying how
#   scripts/wasm-c.sh build SRC OUT    compile SRC (a .c file) to OUT
#
# The packages: clang, lld, wasi-libc and libclang-rt-dev-wasm32 (clang's
# wasm32 builtins, which wasi-libc's printf needs), about 150 MB installed.
set -euo pipefail

PACKAGES="clang lld wasi-libc libclang-rt-dev-wasm32"
SYSROOT=/usr
CC=${WASM_CC:-clang}

present() {
	command -v "$CC" >/dev/null 2>&1 || return 1
	[ -f "$SYSROOT/lib/wasm32-wasi/libc.a" ] || return 1
	# The builtins library sits in clang's resource directory.
	local rt
	rt=$("$CC" --target=wasm32-wasi -print-libgcc-file-name 2>/dev/null) || return 1
	[ -f "$rt" ] || return 1
	command -v wasm-ld >/dev/null 2>&1 || ls /usr/bin/wasm-ld-* >/dev/null 2>&1 || return 1
}

case "${1:-}" in
check)
	present
	;;
ensure)
	if present; then exit 0; fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "the C toolchain for plugins/c is missing: install it with: sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends $PACKAGES'" >&2
		exit 1
	fi
	echo "installing $PACKAGES ..." >&2
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update >&2
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends $PACKAGES >&2
	present
	;;
build)
	[ "$#" -eq 3 ] || { echo "usage: $0 build SRC OUT" >&2; exit 2; }
	if ! present; then
		echo "the C toolchain for plugins/c is missing: install it with: sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends $PACKAGES'" >&2
		exit 1
	fi
	# A WASI reactor (exports _initialize, no main), optimised.
	"$CC" --target=wasm32-wasi --sysroot="$SYSROOT" -mexec-model=reactor -O2 -Wall -Wextra -Werror -o "$3" "$2"
	;;
*)
	echo "usage: $0 check | ensure | build SRC OUT" >&2
	exit 2
	;;
esac
