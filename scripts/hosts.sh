#!/usr/bin/env bash
# Many hosts on one machine, for people: the layout the kvfabric-testbed crate
# makes for tests and benches (testbed/src/net.rs), by hand.
#
#   scripts/hosts.sh up N [--link-gbit G]   N hosts kvfhosts-h0.. on a bridge (in kvfhosts-br),
#                                           host i at 10.203.0.(i+2)/24, links shaped to G Gbit/s
#   scripts/hosts.sh shape I G|off          reshape host I's link
#   scripts/hosts.sh link I down|up         partition host I / heal it
#   scripts/hosts.sh exec I CMD...          run CMD inside host I
#   scripts/hosts.sh down                   kill what runs inside and delete every namespace
#
# Example: etcd on host 0, an engine on hosts 1 and 2 (see docs/BENCHMARKS.md):
#   scripts/hosts.sh up 3 --link-gbit 10
#   scripts/hosts.sh exec 0 etcd --listen-client-urls http://10.203.0.2:2379 \
#       --advertise-client-urls http://10.203.0.2:2379 &
#   scripts/hosts.sh exec 1 kvfabric engine --listen 10.203.0.3:8000 --etcd http://10.203.0.2:2379 ...
# Needs root. Addresses exist only inside the namespaces.
set -euo pipefail
P=kvfhosts
BR="$P-br"

die() { echo "hosts.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"

shape() { # ns dev gbit|off
  if [ "$3" = off ]; then
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
  else
    local bits burst
    bits=$(awk -v g="$3" 'BEGIN { printf "%d", g * 1e9 }')
    burst=$(( bits / 8 / 500 )); [ "$burst" -lt 131072 ] && burst=131072
    tc -n "$1" qdisc replace dev "$2" root tbf rate "${bits}bit" burst "$burst" latency 20ms
  fi
}

down() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
}

case "${1:-}" in
  up)
    n="${2:?hosts.sh up N [--link-gbit G]}"; gbit=off
    [ "${3:-}" = --link-gbit ] && gbit="${4:?rate}"
    down
    trap 'down' ERR
    ip netns add "$BR"; ip -n "$BR" link set lo up
    ip -n "$BR" link add br0 type bridge; ip -n "$BR" link set br0 up
    for i in $(seq 0 $((n - 1))); do
      ns="$P-h$i"
      ip netns add "$ns"; ip -n "$ns" link set lo up
      ip -n "$BR" link add "h$i" type veth peer name eth0 netns "$ns"
      ip -n "$BR" link set "h$i" master br0 up
      ip -n "$ns" addr add "10.203.0.$((i + 2))/24" dev eth0
      ip -n "$ns" link set eth0 up
      shape "$ns" eth0 "$gbit"; shape "$BR" "h$i" "$gbit"
      echo "host $i: $ns 10.203.0.$((i + 2)) link ${gbit} Gbit/s"
    done ;;
  shape) shape "$P-h${2:?I}" eth0 "${3:?G|off}"; shape "$BR" "h$2" "$3" ;;
  link) ip -n "$BR" link set "h${2:?I}" "${3:?down|up}" ;;
  exec) i="${2:?I}"; shift 2; exec ip netns exec "$P-h$i" "$@" ;;
  down) down ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
