#!/usr/bin/env bash
# Runs fleetd's whole test suite, after cargo fmt --check and clippy. First installs what a
# fresh Debian machine lacks: tmux (the tests drive real tmux servers), bubblewrap (the sandbox
# tests' runtime), podman with crun and runc (the container tests' runtime), systemd-analyze
# (the unit in contrib/ is checked), rabbitmq-server (the federation tests' broker, and their
# private node), chromium and chromium-driver (the web
# view is tested in a real browser), in a
# virtualenv outside the tree the Python `mcp` SDK (a second real MCP client) and the Prometheus
# client (its OpenMetrics parser reads /metrics in the tests) and openapi-spec-validator (the
# API's OpenAPI document is checked, and what the API answers against it), and outside the
# tree the pinned Claude Code and opencode releases from npm (real agent workers, on a scripted
# model).
# Extra arguments go to the test runner.
set -euo pipefail
cd "$(dirname "$0")"

missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v pkill >/dev/null 2>&1 || missing+=(procps)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# The container tests run podman; with crun (Debian's default) and runc (for a machine whose
# cgroups crun refuses, as one that is itself a container may have).
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v crun >/dev/null 2>&1 || missing+=(crun)
command -v runc >/dev/null 2>&1 || missing+=(runc)
# The workspace tests make real git worktrees.
command -v git >/dev/null 2>&1 || missing+=(git)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# The service test checks the systemd unit with systemd-analyze (nothing is started).
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
# The broker tests use the machine's RabbitMQ on 127.0.0.1:5672 when it runs, else start a
# private node; either way they need the server and rabbitmqctl.
[ -x /usr/sbin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1 ||
  missing+=(rabbitmq-server)
# The partition test puts a gateway in a network namespace behind a veth it takes down.
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# The web view's test drives a real headless Chromium through its WebDriver.
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

venv="${FLEET_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetd/test-venv}"
if ! "$venv/bin/python" -c 'import mcp, prometheus_client, openapi_spec_validator' >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'mcp==2.3.0' 'prometheus-client==0.21.1' 'openapi-spec-validator==0.7.1'
fi
export FLEET_TEST_PYTHON="$venv/bin/python"

claude_version="2.1.332"
opencode_version="1.18.33"
npm_dir="${FLEET_TEST_NPM:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetd/npm}"
claude="$npm_dir/node_modules/.bin/claude"
opencode="$npm_dir/node_modules/.bin/opencode"
if ! "$claude" --version 2>/dev/null | grep -q "^$claude_version " ||
  [ "$("$opencode" --version 2>/dev/null)" != "$opencode_version" ]; then
  npm install --prefix "$npm_dir" --no-fund --no-audit --loglevel=error \
    "@anthropic-ai/claude-code@$claude_version" "opencode-ai@$opencode_version"
fi
export FLEET_TEST_CLAUDE="$claude" FLEET_TEST_OPENCODE="$opencode"

# The house rules are checked, not remembered: unformatted code or a clippy warning (an unwrap
# outside tests among them, see [workspace.lints]) fails the run before any test.
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

# The tests start the workspace's binaries (fleetd, fleet-agent-sim): build them all first.
cargo build --workspace --bins
if cargo nextest --version >/dev/null 2>&1; then
  exec cargo nextest run --workspace --no-fail-fast "$@"
else
  exec cargo test --workspace --no-fail-fast "$@"
fi
