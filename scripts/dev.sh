#!/usr/bin/env bash
# scripts/dev.sh PLUGINS_DIR CONFIG MODULE_DIR... — the author's loop behind
# `make dev`: build every module directory into PLUGINS_DIR, start the host
# with --watch on it, and rebuild a module whenever a file of its directory
# changes; the host's watcher then reloads it. A module directory is a Go
# main package (its own go.mod, as `protean-host plugin new` writes, or a
# package of this repository such as plugins/examples/orders); the module
# file is named after the directory. A MODULE_DIR that is not a module is a
# parent: each of its subdirectories that is a module is one, rescanned at
# every poll, so a module directory created while dev runs is built and
# served. A build that fails leaves the running module in place and prints
# the compiler's errors.
#
# PLUGINS_DIR is dev's own: it serves exactly the modules of MODULE_DIR...
# A *.wasm file there that none of them builds (left by an earlier run with
# other modules, or of a module directory since removed) is deleted.
#
# Each build is scripts/build-module.sh, the command make plugins runs: the
# same sources give the same bytes, so switching between make run and
# make dev finds every module in the compiled-code cache.
#
# After a rebuild the script says what the host made of it (tell): "live"
# with the module's version once GET /v1/plugins serves the SHA-256 just
# built, or "rejected" with the host's reason (the running version keeps
# serving), or, after DEV_WAIT seconds (default 30), that it could not
# tell. It asks the address the host logs as listening (DEV_ADDR
# overrides), with DEV_TOKEN as bearer key when the host has credentials.
#
# Polling (every DEV_POLL seconds, default 1) rather than inotify: nothing
# to install, and a build takes longer than the poll anyway.
set -u
plugins=$1 config=$2
shift 2
host=${HOST_BIN:-build/protean-host}
poll=${DEV_POLL:-1}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$plugins"
plugins=$(cd "$plugins" && pwd)

# is_module DIR: DIR holds a Go main package (a go.mod alone may be a
# parent's, shared by its subdirectories).
is_module() {
	grep -qsE '^package main([[:space:]]|$)' "$1"/*.go
}

# modules: the module directories of the arguments, parents expanded.
modules() {
	local d s
	for d in "$@"; do
		d=${d%/}
		if is_module "$d"; then
			echo "$d"
			continue
		fi
		for s in "$d"/*/; do
			s=${s%/}
			if [ -d "$s" ] && is_module "$s"; then echo "$s"; fi
		done
	done
}

# build DIR: compile the module of DIR into $plugins/NAME.wasm.
build() {
	local dir=$1 out
	out=$plugins/$(basename "$dir").wasm
	if "$here/build-module.sh" "$dir" "$out"; then
		echo "dev: built $dir -> $out"
	else
		echo "dev: build of $dir failed; the running module is unchanged"
		return 1
	fi
}

# tell NAME: wait for the host to report NAME.wasm at the bytes just
# built: served ("live"), or refused ("rejected", with the reason).
# Matches GET /v1/plugins' compact JSON with sed: no jq needed.
tell() {
	local name=$1 file sum n addr body v err deadline auth=()
	file=$plugins/$name.wasm
	[ -n "${DEV_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $DEV_TOKEN")
	if ! command -v curl >/dev/null 2>&1; then
		echo "dev: $name built; without curl the script cannot tell whether the host took it"
		return 0
	fi
	sum=$( (sha256sum "$file" 2>/dev/null || shasum -a 256 "$file") | cut -d' ' -f1)
	n=$(printf '%s' "$name" | sed 's/\./\\./g')
	deadline=$(($(date +%s) + ${DEV_WAIT:-30}))
	while [ "$(date +%s)" -le "$deadline" ]; do
		addr=${DEV_ADDR:-$(sed -n 's/.*msg=listening .*admin_addr=\([^ ]*\).*/\1/p' "$hostlog" 2>/dev/null | tail -n 1)}
		if [ -n "$addr" ] && body=$(curl -fsS --max-time 2 ${auth[@]+"${auth[@]}"} "http://$addr/v1/plugins" 2>/dev/null); then
			v=$(printf '%s' "$body" | sed -nE 's/.*"file":"'"$n"'\.wasm","name":"[^"]*","version":"([^"]*)","sha256":"'"$sum"'".*/\1/p')
			if [ -n "$v" ]; then
				echo "dev: $name live (version $v)"
				return 0
			fi
			err=$(printf '%s' "$body" | sed -nE 's/.*"rejected":\{"file":"'"$n"'\.wasm",("tenant":"[^"]*",)?"sha256":"'"$sum"'","error":"(([^"\\]|\\.)*)".*/\2/p')
			if [ -n "$err" ]; then
				err=$(printf '%s' "$err" | sed -e 's/\\u003c/</g' -e 's/\\u003e/>/g' -e 's/\\u0026/\&/g' -e 's/\\"/"/g' -e 's/\\n/ /g' -e 's/\\\\/\\/g')
				echo "dev: $name rejected: $err"
				return 1
			fi
		fi
		sleep 0.5
	done
	echo "dev: $name built, but the host did not report it within ${DEV_WAIT:-30}s (GET /v1/plugins on ${addr:-an address not yet logged}); cannot tell whether it is live"
	return 1
}

# prune NAME...: delete every *.wasm of $plugins not named NAME.wasm.
prune() {
	local f keep n
	for f in "$plugins"/*.wasm; do
		[ -e "$f" ] || continue
		keep=
		for n in "$@"; do
			if [ "$(basename "$f")" = "$n.wasm" ]; then keep=1; fi
		done
		if [ -z "$keep" ]; then
			rm -f "$f"
			echo "dev: removed $f (not a module of MODULES)" >&2
		fi
	done
}

# Each module has a stamp file, touched just before its build: a source
# file newer than it is a change (one made during a build triggers the
# next); a module without one is new. POSIX find and plain files, no bash
# 4 or GNU find needed.
stamps=$(mktemp -d)
trap 'rm -rf "$stamps"' EXIT
stamp() { echo "$stamps/$(basename "$1")"; }
changed() {
	[ ! -e "$(stamp "$1")" ] ||
		[ -n "$(find "$1" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -newer "$(stamp "$1")" -print | head -n 1)" ]
}

# rescan: the module list, then prune what it does not build; prints the
# list, one directory a line.
rescan() {
	local list
	list=$(modules "$@")
	# shellcheck disable=SC2046
	prune $(for d in $list; do basename "$d"; done)
	[ -z "$list" ] || echo "$list"
}

first=$(rescan "$@")
if [ -z "$first" ]; then
	echo "dev: no module directory in $*" >&2
	exit 1
fi
for d in $first; do
	touch "$(stamp "$d")"
	build "$d" || exit 1
done

# RUN_FLAGS: more flags for run (word-split on purpose), e.g. --listen.
# shellcheck disable=SC2086
# The host's log goes to the terminal and to hostlog, where tell finds the
# address it listens on.
hostlog=$stamps/.host.log
"$host" run --config "$config" --plugins "$plugins" --watch ${RUN_FLAGS:-} 2> >(tee "$hostlog" >&2) &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid; exit' INT TERM
trap 'kill $pid 2>/dev/null; rm -rf "$stamps"' EXIT
echo "dev: host pid $pid, plugins $plugins; watching $* (Ctrl-C stops)"
while kill -0 "$pid" 2>/dev/null; do
	sleep "$poll"
	for d in $(rescan "$@"); do
		if changed "$d"; then
			touch "$(stamp "$d")"
			build "$d" && tell "$(basename "$d")"
		fi
	done
done
wait "$pid"
