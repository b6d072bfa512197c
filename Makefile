# Conveniences; the README's two commands are the supported entry points.
CACHE ?= $(or $(ARTEMIS_STUDIO_CACHE),$(HOME)/.cache/artemis-studio)
export CARGO_TARGET_DIR ?= $(CACHE)/target

.PHONY: crds test demo up down fmt lint release image

# Regenerate crds/ and the chart's CRDs from the Rust types (a unit test fails when they drift).
crds:
	cargo run --quiet --bin artemis-studio-operator -- crd > crds/artemis-studio.io.yaml
	cp crds/artemis-studio.io.yaml charts/artemis-studio-operator/crds/artemis-studio.io.yaml

test:
	deploy/dev/test

demo:
	deploy/dev/demo

up:
	deploy/dev/testbed up

down:
	deploy/dev/testbed down

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

# The kubectl-artemis release archives and their krew manifest, in target/release-archives
# (deploy/release/archives --help: --out, --target, --base-url; pass them as ARGS="…").
release:
	deploy/release/archives $(ARGS)

# The operator image, with an SBOM and a provenance attestation attached (docker buildx; pass
# e.g. IMAGE=ghcr.io/you/artemis-studio-operator:0.1.0 and ARGS=--push).
IMAGE ?= artemis-studio-operator:dev
image:
	docker buildx build -f deploy/image/Dockerfile --sbom=true --provenance=mode=max -t $(IMAGE) $(ARGS) .
