// SPDX-License-Identifier: (Apache-2.0 OR MIT)
/*
 * The sockmap transport's verdict program (SK_MSG, attached to zh_socks).
 *
 * It runs in the sender's sendmsg for every message on a party's socket, and:
 *  1. finds the sender (its socket's port, registered by the agent): the kernel's word for
 *     who sent, which no function can forge;
 *  2. takes exactly one message of ZH_MSG_LEN bytes, else drops it;
 *  3. checks the edge (sender's function -> the descriptor's `next`) against zh_policy, the
 *     chain's declared edges; an undeclared one is refused: counted, and the descriptor goes
 *     back to the gateway waiting for its request, marked, so the request gets an answer;
 *  4. picks the instance: the one the sender chose if it runs `next`, else one of `next`'s
 *     instances from zh_instances;
 *  5. stamps the sender's party in the trailer and redirects the message into the chosen
 *     instance's socket (ingress: it lands in that socket's receive queue).
 * Counters per function in zh_stats. Nothing is pinned: the programs and maps live as long
 * as the agent's descriptors of them.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "zerohop.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 1); /* set by the loader: the chain's parties */
	__type(key, __u32);
	__type(value, __u32);
} zh_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32); /* local TCP port, host order */
	__type(value, struct zh_sender);
} zh_senders SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* party */
	__type(value, __u32); /* function index */
} zh_party_fn SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32); /* zh_edge_key */
	__type(value, __u8);
} zh_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32); /* function index */
	__type(value, __u32); /* instances in zh_instances */
} zh_fn_count SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32); /* zh_instance_key */
	__type(value, __u32); /* party */
} zh_instances SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct zh_config);
} zh_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ZH_STAT_ROWS);
	__type(key, __u32); /* function index, or ZH_UNKNOWN_SENDER */
	__type(value, struct zh_fn_stats);
} zh_stats SEC(".maps");

static __always_inline struct zh_fn_stats *stats_of(__u32 row)
{
	return bpf_map_lookup_elem(&zh_stats, &row);
}

static __always_inline int drop(__u32 row, __u32 reason)
{
	struct zh_fn_stats *s = stats_of(row);

	if (s && reason < ZH_DROPS)
		s->dropped[reason]++;
	return SK_DROP;
}

SEC("sk_msg")
int zh_verdict(struct sk_msg_md *msg)
{
	__u32 port = msg->local_port;
	struct zh_sender *sender = bpf_map_lookup_elem(&zh_senders, &port);
	struct zh_trailer *trailer;
	__u8 *data, *end;
	__u32 from_fn, next, to, zero = 0;

	if (!sender)
		return drop(ZH_UNKNOWN_SENDER, ZH_DROP_UNKNOWN);
	from_fn = sender->function;
	if (msg->size != ZH_MSG_LEN)
		return drop(from_fn, ZH_DROP_MALFORMED);
	data = msg->data;
	end = msg->data_end;
	if (data + ZH_MSG_LEN > end) {
		if (bpf_msg_pull_data(msg, 0, ZH_MSG_LEN, 0))
			return drop(from_fn, ZH_DROP_MALFORMED);
		data = msg->data;
		end = msg->data_end;
		if (data + ZH_MSG_LEN > end)
			return drop(from_fn, ZH_DROP_MALFORMED);
	}
	trailer = (struct zh_trailer *)(data + ZH_DESC_LEN);
	next = data[ZH_DESC_NEXT];

	__u32 edge = zh_edge_key(from_fn, next);
	if (!bpf_map_lookup_elem(&zh_policy, &edge)) {
		struct zh_config *cfg = bpf_map_lookup_elem(&zh_config, &zero);
		__u32 request = *(__u32 *)(data + ZH_DESC_REQUEST);

		drop(from_fn, ZH_DROP_EDGE);
		if (!cfg || cfg->gateways == 0)
			return SK_DROP;
		trailer->party = sender->party;
		trailer->verdict = ZH_VERDICT_REFUSED_EDGE;
		trailer->reserved = 0;
		return bpf_msg_redirect_map(msg, &zh_socks, request % cfg->gateways,
					    BPF_F_INGRESS);
	}

	to = trailer->party;
	__u32 *runs = bpf_map_lookup_elem(&zh_party_fn, &to);
	if (!runs || *runs != next) {
		__u32 *count = bpf_map_lookup_elem(&zh_fn_count, &next);
		__u32 key, *party;

		if (!count || *count == 0)
			return drop(from_fn, ZH_DROP_NO_INSTANCE);
		key = zh_instance_key(next, bpf_get_prandom_u32() % *count);
		party = bpf_map_lookup_elem(&zh_instances, &key);
		if (!party)
			return drop(from_fn, ZH_DROP_NO_INSTANCE);
		to = *party;
	}
	trailer->party = sender->party;
	trailer->verdict = ZH_VERDICT_DELIVERED;
	trailer->reserved = 0;
	if (bpf_msg_redirect_map(msg, &zh_socks, to, BPF_F_INGRESS) != SK_PASS)
		return drop(from_fn, ZH_DROP_NO_SOCKET);

	struct zh_fn_stats *s = stats_of(from_fn);
	if (s)
		s->sent++;
	s = stats_of(next);
	if (s)
		s->received++;
	return SK_PASS;
}
