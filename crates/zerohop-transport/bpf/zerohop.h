/* SPDX-License-Identifier: (Apache-2.0 OR MIT) */
/*
 * What the sockmap transport's eBPF programs and the Rust side agree on: every struct
 * and map key, and every constant. The single source of truth: the programs include it,
 * and `crates/zerohop-transport/src/sockmap/abi.rs` mirrors it, which a test checks by
 * compiling this header with the C compiler and comparing sizes, offsets and values.
 *
 * A message on a party's socket is one descriptor (16 bytes, docs/protocol.md) and a
 * trailer. The sender writes in the trailer the instance its picker chose; the verdict
 * program overwrites it with the sender's own party and the verdict, so the receiver
 * learns who sent the descriptor from the kernel, not from the sender.
 */
#ifndef ZEROHOP_BPF_H
#define ZEROHOP_BPF_H

#include <linux/types.h>

/* Bytes of a descriptor, and of a whole message (descriptor + trailer). */
#define ZH_DESC_LEN 16
#define ZH_MSG_LEN 20

/* Offsets of the descriptor's fields that the verdict program reads. */
#define ZH_DESC_NEXT 3     /* u8: function index of the receiver */
#define ZH_DESC_REQUEST 8  /* u32 LE: the gateway's request id */

/* The gateway's function index. */
#define ZH_GATEWAY_FN 255
/* Counter rows: one per function index (the gateway's is 255), then senders unknown to
 * the program (a socket the agent did not register). */
#define ZH_UNKNOWN_SENDER 256
#define ZH_STAT_ROWS 257

/* Instances per function the program can pick from. */
#define ZH_MAX_INSTANCES 4096

/* Trailer verdicts. */
#define ZH_VERDICT_DELIVERED 0
/* The chain declares no edge from the sender's function to the descriptor's `next`: the
 * descriptor went back to the gateway waiting for its request instead. */
#define ZH_VERDICT_REFUSED_EDGE 1

/* Drop reasons, indexes into zh_fn_stats.dropped. */
#define ZH_DROP_MALFORMED 0   /* not exactly one message of ZH_MSG_LEN bytes */
#define ZH_DROP_EDGE 1        /* edge not declared (refused and returned to the gateway) */
#define ZH_DROP_NO_INSTANCE 2 /* the next function has no instance */
#define ZH_DROP_NO_SOCKET 3   /* the chosen party has no socket in the map */
#define ZH_DROP_UNKNOWN 4     /* the sender's socket is not registered */
#define ZH_DROPS 5

/* The trailer after the descriptor. */
struct zh_trailer {
	__u16 party;   /* sender writes: the instance it chose; receiver reads: the sender */
	__u8 verdict;  /* ZH_VERDICT_*, written by the program */
	__u8 reserved; /* zero */
};

/* Value of zh_senders (key: the socket's local TCP port, host order). */
struct zh_sender {
	__u16 party;
	__u8 function;
	__u8 reserved;
};

/* Value of zh_config's only entry. */
struct zh_config {
	__u32 gateways; /* gateway parties; a request's gateway is request % gateways */
	__u32 parties;  /* parties in the chain (entries of zh_socks and zh_party_fn) */
};

/* Per-function counters (per CPU; the agent sums them). */
struct zh_fn_stats {
	__u64 sent;     /* descriptors this function's instances sent that were delivered */
	__u64 received; /* descriptors delivered to this function's instances */
	__u64 dropped[ZH_DROPS]; /* refused, by reason, counted on the sender's function */
};

/* Key of zh_policy: an allowed edge between functions (value: a __u8 1). */
static inline __u32 zh_edge_key(__u32 from, __u32 to)
{
	return (from << 8) | to;
}

/* Key of zh_instances: the i-th instance of function f (value: its party, a __u32). */
static inline __u32 zh_instance_key(__u32 f, __u32 i)
{
	return f * ZH_MAX_INSTANCES + i;
}

#endif
