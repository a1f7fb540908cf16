# Sourced by the tests that run flextier inside a memory cgroup
# (tests/cli/test_cli_memory.sh, tests/train/test_train_memory.sh), with
# CG_TEST_PROG (the test's name) and CG_TEST_WORK (a prefix for its
# directory under /var/tmp) set: skips (exit 77, with a message) without
# root, in a sanitizer build (ASan's shadow memory is charged to the
# cgroup, outside any --memory budget) or without a cgroup memory
# controller; otherwise loads the peers' cgroup helpers (peers_cg_init /
# peers_cg_run / peers_cg_cleanup), makes $work (removed on exit with the
# cgroup) and defines ok, bad (counting into $pass, $fail) and mib.
if [ "$(id -u)" != 0 ]; then echo "skipped: needs root (memory cgroups)"; exit 77; fi
if [ -n "${FT_TEST_SANITIZED:-}" ]; then
    echo "skipped: a sanitizer build (ASan's shadow memory is charged to the cgroup, outside any --memory budget)"
    exit 77
fi
PEERS_PROG=$CG_TEST_PROG
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../../scripts/bench/peers-lib.sh"
# peers_cg_init exits on a machine without a memory controller: probe first
if ! { [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; } &&
   [ ! -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
    echo "skipped: no cgroup memory controller"; exit 77
fi
peers_cg_init
work=$(mktemp -d "/var/tmp/$CG_TEST_WORK.XXXXXX")
trap 'peers_cg_cleanup; rm -rf "$work"' EXIT
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
mib() { echo "$(( $1 >> 20 ))"; }
