# protean-host — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
PLUGINS_DIR ?= build/plugins
# Where make build puts the host binary (the targets that run it use it).
HOST_BIN ?= build/protean-host
CONFIG ?= configs/domain.toml
# A count, not a duration: go1.26's fuzz coordinator can fail a run whose
# -fuzztime deadline fires mid-execution (golang/go#75804); a count has no
# deadline to race.
FUZZTIME ?= 50000x
BENCHTIME ?= 1s
EXAMPLES := $(notdir $(wildcard plugins/examples/*))
# Module source directories `make dev` builds and watches: the examples, or
# your own (make dev MODULES="../handlers/my_projector ../handlers/orders").
# An entry that is not a module (no *.go of package main) is a parent whose
# module subdirectories are watched, new ones too (MODULES=../handlers).
MODULES ?= plugins/examples
# make dev's own plugins directory: it serves exactly MODULES, and deletes
# any other *.wasm there.
DEV_PLUGINS_DIR ?= build/dev-plugins
# More flags for `protean-host run` in make run, make production and make dev, e.g.
# RUN_FLAGS="--listen 127.0.0.1:9090".
RUN_FLAGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show the targets
	@awk 'BEGIN {FS = ":.*##"} /^[a-z-]+:.*##/ {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: plugins
plugins: ## Build the example plugins into PLUGINS_DIR (default build/plugins) with plain Go (wasip1, scripts/build-module.sh)
	@mkdir -p $(PLUGINS_DIR)
	@for p in $(EXAMPLES); do \
		echo "plugin $$p -> $(PLUGINS_DIR)/$$p.wasm"; \
		GO=$(GO) scripts/build-module.sh plugins/examples/$$p $(PLUGINS_DIR)/$$p.wasm || exit 1; \
	done
	@# The C examples (ABI v2 without the Go kit) go to build/plugins-c: each
	@# replaces its Go namesake, so they cannot share one plugins directory.
	@if scripts/wasm-c.sh check; then \
		mkdir -p $(PLUGINS_DIR)-c; \
		for c in plugins/c/*.c; do \
			n=$$(basename $$c .c); echo "plugin $$c -> $(PLUGINS_DIR)-c/$$n.wasm"; \
			scripts/wasm-c.sh build $$c $(PLUGINS_DIR)-c/$$n.wasm || exit 1; \
		done; \
	else \
		echo "note: skipping plugins/c (no clang/lld/wasi-libc; scripts/wasm-c.sh ensure installs them)"; \
	fi

.PHONY: plugins-embed
# Not part of plugins: make plugins, make dev and a scaffold's make build
# write the same bytes from one source (TestOneBuildOfAModule), and this
# needs the host binary and compiles each module once (into the config's
# cache_dir, where a start then finds it: the section is not part of the
# compiled code).
plugins-embed: plugins build ## Build the example plugins and embed each one's manifest (protean-host plugin embed-manifest), so a cold start runs none of them to read it
	$(HOST_BIN) plugin embed-manifest --config $(CONFIG) $(PLUGINS_DIR)/*.wasm

.PHONY: build
# The build's name (protean-host version, the status page, the log):
# the nearest tag or the commit, -dirty for uncommitted changes.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)

build: ## Build the protean-host binary into build/
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o $(HOST_BIN) ./cmd/protean-host

.PHONY: run
run: plugins build ## Build the examples and start the host on the embedded default (memory stores, inline broker)
	$(HOST_BIN) run --config $(CONFIG) --plugins $(PLUGINS_DIR) $(RUN_FLAGS)

.PHONY: production
production: plugins build ## Build the examples, migrate, and start the host on PostgreSQL and Redis (configs/production.toml; from PROTEAN_DATABASE_URL and PROTEAN_REDIS_URL; scripts/services.sh up starts private ones)
	$(HOST_BIN) migrate --config configs/production.toml
	$(HOST_BIN) run --config configs/production.toml --plugins $(PLUGINS_DIR) $(RUN_FLAGS)

.PHONY: dev
dev: build ## Build MODULES (default: the examples; a parent dir: its module subdirs, new ones too) into DEV_PLUGINS_DIR, serve exactly those with --watch, rebuild a module when its sources change
	RUN_FLAGS='$(RUN_FLAGS)' scripts/dev.sh $(DEV_PLUGINS_DIR) $(CONFIG) $(MODULES)

.PHONY: validate
validate: plugins build ## Validate the example plugins against the config
	$(HOST_BIN) validate --config $(CONFIG) --plugins $(PLUGINS_DIR)

.PHONY: test
# Tests share one compiled-code cache: the plain pass compiles each WASM
# module once (~1.5 s each), so the race pass (where a compile takes ~15 s)
# finds them compiled.
export PROTEAN_TEST_WASM_CACHE ?= $(CURDIR)/build/test-wasm-cache

# Every stage runs even when an earlier one failed, so one run reports every
# failure; the target fails if any stage did, and says which. The plain and
# the race pass share one start of the test services: the plain pass's
# status goes to a file, the race pass runs whatever it was, and the
# services script exits with the race pass's status. (If the services do
# not start, neither pass ran and both are reported.)
test: ## Lint, model-check, every test, then again under the race detector (real PostgreSQL and Redis it starts), then each fuzz target briefly
	@failed=""; \
	$(MAKE) --no-print-directory lint || failed="$$failed, lint"; \
	$(MAKE) --no-print-directory verify || failed="$$failed, verify"; \
	plain=$$(mktemp); \
	scripts/test-services.sh sh -c 'go=$$1 plain=$$2; \
		$$go test -count=1 -timeout 20m ./...; echo $$? >"$$plain"; \
		$$go test -race -count=1 -timeout 30m ./...' sh "$(GO)" "$$plain"; \
	race=$$?; \
	[ "$$(cat "$$plain")" = 0 ] || failed="$$failed, tests"; \
	[ "$$race" = 0 ] || failed="$$failed, race tests"; \
	rm -f "$$plain"; \
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(if $(CI),20000x,$(FUZZTIME)) || failed="$$failed, fuzz"; \
	if [ -n "$$failed" ]; then echo "make test: failed: $${failed#, }"; exit 1; fi; \
	echo "make test: lint, verify, tests, race tests and fuzz all passed"

.PHONY: lint
lint: ## gofmt, go mod tidy (as a check) and go vet (host and wasip1 guest builds)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) mod tidy -diff >/dev/null || { echo "go mod tidy would change go.mod or go.sum:"; $(GO) mod tidy -diff; exit 1; }
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./pdk/... ./plugins/...

.PHONY: verify
verify: ## Model-check the partition lease/fence protocol with spin (model/verify.sh; installs spin as root)
	model/verify.sh

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 50000x executions)
	@set -e; for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for f in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
			echo "fuzz $$dir $$f ($(FUZZTIME))"; \
			$(GO) test $$dir -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) >/tmp/protean-fuzz.log 2>&1 || { cat /tmp/protean-fuzz.log; exit 1; }; \
		done; \
	done

.PHONY: bench
bench: ## Run the benchmarks, each beside its baseline, against real PostgreSQL and Redis it starts
	scripts/test-services.sh $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

# make chaos: the fault-injection harness (internal/chaos/, cmd/chaos) on
# the real binary. SEED fixes the schedule (empty: one is drawn and
# printed); FAULTS is the number of fault steps (empty: every kind alone
# once, then 3 mixed steps); KINDS restricts the kinds (comma-separated);
# CHAOS_FLAGS passes more flags (build/chaos -h lists them).
SEED ?=
FAULTS ?=
KINDS ?=
CHAOS_FLAGS ?=

.PHONY: chaos
chaos: build plugins ## Fault injection: 3 hosts on a private PostgreSQL and Redis, load, faults from SEED (FAULTS steps, KINDS), then the checks; exit 1 on a violation
	$(GO) build -o build/chaos ./cmd/chaos
	./build/chaos -bin $(HOST_BIN) -plugins $(PLUGINS_DIR) \
		$(if $(SEED),-seed $(SEED)) $(if $(FAULTS),-faults $(FAULTS)) $(if $(KINDS),-kinds $(KINDS)) $(CHAOS_FLAGS)

# make load: the end-to-end HTTP measurement (internal/loadgen/,
# cmd/loadgen) on a private PostgreSQL and Redis: the raw commit-and-publish
# floor, then each host count of HOSTS, each phase LOAD_DURATION long.
# PROFILE=dir saves each host's CPU, block, mutex and allocation profiles and goroutine
# dump over each maximum phase into dir, with summary.txt (every process's
# CPU, the profiles' top entries), printed after the table, each host
# configuration's half-load orders in time ({config}-orders.csv) and the
# hosts' logs (GODEBUG=gctrace=1 puts their collections there), each
# host's metrics at the phase's start and end, Redis's latency events
# (redis-latency.txt) and PostgreSQL's log (slow plans, autovacuum).
# COMPARE="a.b=v c.d=w" measures 1 host (COMPARE_HOSTS=3: 3 hosts) once
# more with each setting, in the same run; COMPARE_BIN="old/protean-host"
# likewise with each other binary (a build of another commit), and
# COMPARE_PLUGINS=build/plugins-c with each directory's modules in place
# of their namesakes (the examples in C: the guests' share of the path).
# ROUNDS=n measures it all n times, every second round in reverse order,
# and prints each configuration's medians. REDIS_FSYNC=always makes the servers' Redis fsync every
# write (default everysec: like PostgreSQL's fsync=off here, it survives a
# kill of the server, not a crash of the machine).
HOSTS ?= 1,3
LOAD_DURATION ?= 20s
PROFILE ?=
COMPARE ?=
COMPARE_HOSTS ?=
COMPARE_BIN ?=
COMPARE_PLUGINS ?=
ROUNDS ?=
REDIS_FSYNC ?=

.PHONY: load
load: build plugins ## End to end over HTTP: orders/s and accepted -> projection p50/p99 at half load, 1 and 3 hosts, beside the floor; PROFILE=dir saves profiles and a summary
	$(GO) run ./cmd/loadgen -bin $(HOST_BIN) -plugins $(PLUGINS_DIR) -hosts $(HOSTS) -duration $(LOAD_DURATION) $(if $(REDIS_FSYNC),-redis-fsync $(REDIS_FSYNC)) $(if $(PROFILE),-profile $(PROFILE)) $(if $(COMPARE_HOSTS),-compare-hosts $(COMPARE_HOSTS)) $(foreach c,$(COMPARE),-compare $(c)) $(foreach b,$(COMPARE_BIN),-compare-bin $(b)) $(foreach d,$(COMPARE_PLUGINS),-compare-plugins $(d)) $(if $(ROUNDS),-rounds $(ROUNDS))

.PHONY: clean
clean: ## Remove build outputs
	rm -rf build
