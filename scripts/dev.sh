#!/usr/bin/env bash
# scripts/dev.sh PLUGINS_DIR CONFIG MODULE_DIR... — the author's loop behind
# `make dev`: build every module directory into PLUGINS_DIR, start the host
# with --watch on it, and rebuild a module whenever a file of its directory
# changes; the host's watcher then reloads it. A module directory is a Go
# main package (its own go.mod, as `protean-host plugin new` writes, or a
# package of this repository such as plugins/examples/orders); the module
# file is named after the directory. A build that fails leaves the running
# module in place and prints the compiler's errors.
#
# Polling (every DEV_POLL seconds, default 1) rather than inotify: nothing
# to install, and a build takes longer than the poll anyway. A new module
# is written under a temporary name and renamed, so the watcher never reads
# a half-written file.
set -u
plugins=$1 config=$2
shift 2
host=${HOST_BIN:-build/protean-host}
poll=${DEV_POLL:-1}
mkdir -p "$plugins"
plugins=$(cd "$plugins" && pwd)

# build DIR: compile the module of DIR into $plugins/NAME.wasm.
build() {
	local dir=$1 name out
	name=$(basename "$dir")
	out=$plugins/$name.wasm
	if (cd "$dir" && GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o "$out.tmp" .); then
		mv "$out.tmp" "$out"
		echo "dev: built $dir -> $out"
	else
		rm -f "$out.tmp"
		echo "dev: build of $dir failed; the running module is unchanged"
		return 1
	fi
}

# Each module has a stamp file, touched just before its build: a source
# file newer than it is a change (one made during a build triggers the
# next). POSIX find and plain files, no bash 4 or GNU find needed.
stamps=$(mktemp -d)
trap 'rm -rf "$stamps"' EXIT
stamp() { echo "$stamps/$(basename "$1")"; }
changed() {
	[ -n "$(find "$1" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -newer "$(stamp "$1")" -print | head -n 1)" ]
}

for d in "$@"; do
	touch "$(stamp "$d")"
	build "$d" || exit 1
done

# RUN_FLAGS: more flags for run (word-split on purpose), e.g. --listen.
# shellcheck disable=SC2086
"$host" run --config "$config" --plugins "$plugins" --watch ${RUN_FLAGS:-} &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid; exit' INT TERM
trap 'kill $pid 2>/dev/null; rm -rf "$stamps"' EXIT
echo "dev: host pid $pid, plugins $plugins; watching $* (Ctrl-C stops)"
while kill -0 "$pid" 2>/dev/null; do
	sleep "$poll"
	for d in "$@"; do
		if changed "$d"; then
			touch "$(stamp "$d")"
			build "$d"
		fi
	done
done
wait "$pid"
