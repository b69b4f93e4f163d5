#!/usr/bin/env bash
# scripts/build-module.sh DIR OUT — build the Go module (main package) of
# DIR into OUT, as every path that builds a module for the user does
# (make plugins, make dev, the scaffold's Makefile spells the same command):
#
#	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o OUT .
#
# run in DIR. One command means one set of bytes per source: the host's
# compiled-code cache is keyed by the bytes, so make run after make dev (or
# the reverse) finds every module compiled. -trimpath also keeps the
# checkout's path out of the module. OUT is written as OUT.tmp and renamed,
# so a host watching its directory never reads a half-written file; a
# failed build leaves OUT as it was.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 DIR OUT" >&2; exit 2; }
dir=$1 out=$2
case $out in /*) ;; *) out=$PWD/$out ;; esac
if (cd "$dir" && GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 ${GO:-go} build -trimpath -buildmode=c-shared -o "$out.tmp" .); then
	mv "$out.tmp" "$out"
else
	rm -f "$out.tmp"
	exit 1
fi
