#!/usr/bin/env bash
# The command-line contract (DESIGN.md): exit 0 ok, 2 bad usage with a message, --help truthful.
set -u
GF="$1"
fail=0
check() {  # check NAME WANT_EXIT CMD...
  local name=$1 want=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ]; then echo "FAIL $name: exit $rc, want $want"; echo "$out" | head -20; fail=1; return; fi
  echo "ok   $name"
  LAST="$out"
}
check help 0 "$GF" --help
echo "$LAST" | grep -q "demo" || { echo "FAIL help does not mention demo"; fail=1; }
check no-args 2 "$GF"
check unknown-command 2 "$GF" frobnicate
echo "$LAST" | grep -q "frobnicate" || { echo "FAIL unknown command not named"; fail=1; }
check ops 0 "$GF" ops
echo "$LAST" | grep -q "Gelu" || { echo "FAIL ops does not list Gelu"; fail=1; }
check demo-bad-flag 2 "$GF" demo --elements
check demo-bad-number 2 "$GF" demo --elements abc
check demo-absurd 2 "$GF" demo --elements 99999999999999
check demo-small 0 "$GF" demo --elements 4096 --repeats 5 --json /tmp/graphfuse_cli_test.json
grep -q '"ops"' /tmp/graphfuse_cli_test.json || { echo "FAIL demo json lacks ops"; fail=1; }
python3 -c "import json,sys; json.load(open('/tmp/graphfuse_cli_test.json'))" || { echo "FAIL demo json invalid"; fail=1; }
check run-missing-model 2 "$GF" run /nonexistent/missing.onnx
echo "$LAST" | grep -q "missing.onnx" || { echo "FAIL run error does not name the file"; fail=1; }
head -c 1000 /dev/urandom > /tmp/graphfuse_garbage.onnx
check run-garbage 2 "$GF" run /tmp/graphfuse_garbage.onnx
check run-no-model 2 "$GF" run
check run-cuda 2 "$GF" run /tmp/graphfuse_garbage.onnx --backend cuda
exit $fail
