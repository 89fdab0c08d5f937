# Sourced by the two-host benchmarks: two network namespaces ($A, $B) joined by a veth pair
# ($VA in A, $VB in B) with addresses $IPA and $IPB (subnet 10.$1.x.0/24, x from the pid),
# removed with whatever still runs in them when the script exits. Needs root.
A=kcb_a$$; B=kcb_b$$; VA=kba$$; VB=kbb$$
IPA=10.$1.$(( $$ % 200 + 20 )).1; IPB=10.$1.$(( $$ % 200 + 20 )).2
cleanup() {  # what still runs in the namespaces (a hung baseline) goes with them
  for ns in "$A" "$B"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add "$VA" netns "$A" type veth peer name "$VB" netns "$B"
ip -n "$A" addr add "$IPA/24" dev "$VA"; ip -n "$B" addr add "$IPB/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up; ip -n "$B" link set "$VB" up
