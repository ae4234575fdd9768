# kvrouter build and test entry points. See README.md.
# ardanlabs/jinja v1.12+ needs Go 1.27; the module proxy serves this toolchain.
export GOTOOLCHAIN := go1.27.3

GO        ?= go
FUZZTIME  ?= 10s
PKGS      := ./...
# Where set-up keeps what it installs outside the repository (tools/setup/setup.sh).
export KVROUTER_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kvrouter
# The Llama-3 tokenizer files set-up installs, for the tokenizer's golden test.
export KVROUTER_LLAMA3_NPM ?= $(KVROUTER_CACHE)/llama3/node_modules
# helm, built by set-up, for the chart tests.
export KVROUTER_HELM ?= $(KVROUTER_CACHE)/bin/helm

.PHONY: test check staticcheck fmt vet deps race fuzz bench demo build image clean setup-test setup-demo k8s-testenv manifests

## test: everything CI runs: set-up, gofmt, vet, import rules, race tests, short fuzzing.
test: setup-test
	@start=$$(date +%s); $(MAKE) --no-print-directory fmt vet deps race fuzz && \
		echo "make test: passed in $$(( $$(date +%s) - start )) s after set-up"

## check: the quick tier for the edit loop: gofmt, vet, staticcheck, import rules and the
## tests under -short, which skip every test needing root or a part set-up installs (Debian
## packages, npm files, helm, kube-apiserver). No root, no race detector; a few minutes.
check:
	@echo "make check: the first run compiles every package and test binary: several minutes"
	@start=$$(date +%s); $(MAKE) --no-print-directory fmt vet staticcheck deps && \
		KVROUTER_LLAMA3_NPM= KVROUTER_HELM= $(GO) test -short -count=1 -timeout 15m $(PKGS) && \
		echo "make check: passed in $$(( $$(date +%s) - start )) s"

# staticcheck, pinned; go run builds it once into Go's build cache.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
staticcheck:
	@echo "staticcheck: $(STATICCHECK) (the first run downloads and compiles it: a few minutes)"
	@$(GO) run $(STATICCHECK) $(PKGS)

## setup-test, setup-demo: install what the tests or the demo need (idempotent; see tools/setup/setup.sh).
setup-test:
	@tools/setup/setup.sh test

setup-demo:
	@tools/setup/setup.sh demo

# The version `kvrouter version` prints for `make build`: the chart's appVersion (as the image
# tags), since a build without VCS stamping (GOFLAGS=-buildvcs=false) would print "(devel)".
VERSION   ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' deploy/helm/kvrouter/Chart.yaml)

build:
	$(GO) build -ldflags "-X main.buildVersionOverride=$(VERSION)" -o bin/kvrouter ./cmd/kvrouter

## image: bin/kvrouter-VERSION.oci.tar, an OCI image archive of the static binary (internal/image),
## built without Docker; load it with ctr/docker/podman or push it with skopeo (docs/kubernetes.md).
IMAGE      ?= kvrouter:$(VERSION)
IMAGE_FILE ?= bin/kvrouter-$(VERSION).oci.tar
CA_CERTS   ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
image:
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "-s -w -X main.buildVersionOverride=$(VERSION)" -o bin/kvrouter-linux ./cmd/kvrouter
	$(GO) run ./tools/image -binary bin/kvrouter-linux -path /usr/local/bin/kvrouter -ref $(IMAGE) -o $(IMAGE_FILE) \
		-port 8080/tcp -cmd serve,--listen,:8080,--config,/etc/kvrouter/router.yaml -version $(VERSION) $(if $(CA_CERTS),-ca-certs $(CA_CERTS))
	@echo "wrote $(IMAGE_FILE) ($(IMAGE))"

fmt:
	@out=$$(gofmt -l cmd internal test tools 2>/dev/null); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

## deps: routing, kvindex, group (a model group's state) and pick never import net/http, so serve,
## sim and bench run the same code; config (router.yaml's schema), group and the HTTP front never
## import the Kubernetes client or ZeroMQ; the endpoint picker reaches the routing core through
## package pick, not the HTTP front.
deps:
	@for p in ./internal/routing ./internal/kvindex ./internal/group ./internal/pick; do \
		if $(GO) list -deps $$p 2>/dev/null | grep -qx 'net/http'; then \
			echo "$$p imports net/http"; exit 1; fi; done
	@if $(GO) list -f '{{join .Imports "\n"}}' ./internal/admission 2>/dev/null | grep -qx 'net/http'; then \
		echo "./internal/admission imports net/http"; exit 1; fi
	@for p in ./internal/config ./internal/group ./internal/admission ./internal/proxy; do \
		if $(GO) list -deps $$p 2>/dev/null | grep -q -e '^k8s\.io/' -e 'zmq'; then \
			echo "$$p imports k8s.io/ or ZeroMQ"; exit 1; fi; done
	@if $(GO) list -deps ./internal/epp 2>/dev/null | grep -qx 'kvrouter/internal/proxy'; then \
		echo "./internal/epp imports internal/proxy"; exit 1; fi

# The ZeroMQ subscriber's replay tests time a real ROUTER/DEALER exchange
# (5 s bounds); beside test/e2e's end-to-end tests on 2 cores they
# flaked, so they run on their own after the rest.
QUIET_PKGS := ./internal/vllm/kvevents
race:
	$(GO) test -race -count=1 -timeout 45m $$($(GO) list $(PKGS) | grep -vx 'kvrouter/internal/vllm/kvevents')
	$(GO) test -race -count=1 -timeout 10m $(QUIET_PKGS)

## fuzz: every Fuzz target for FUZZTIME each (seeds also run in "race").
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' internal cmd test 2>/dev/null); do \
		dir=./$$(dirname $$f); \
		for t in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | sed 's/^func //'); do \
			echo "fuzz $$dir $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$dir; \
		done; done

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## k8s-testenv: etcd (Debian's etcd-server) and kube-apiserver for internal/k8stest, built once
## from the k8s.io/kubernetes module and cached outside the repo (see tools/k8s-testenv/setup.sh).
k8s-testenv:
	GO=$(GO) bash tools/k8s-testenv/setup.sh

## manifests: deploy/manifests/*.yaml, plain manifests rendered from the Helm chart (default
## values and the production-stack example) for users without Helm; TestManifests checks them.
manifests:
	@tools/manifests/render.sh deploy/manifests

## demo: 4 engine-sims and kvrouter on loopback, Mooncake trace slice, round_robin vs kv.
demo: setup-demo
	@echo "demo: compiling kvrouter into bin/ (the first build compiles every dependency: several minutes on 2 cores)"
	@$(GO) build -ldflags "-X main.buildVersionOverride=$(VERSION)" -o bin/kvrouter ./cmd/kvrouter
	bin/kvrouter demo

clean:
	rm -rf bin
