//! From a validated spec to the routing plan every party receives.

use crate::plan::{FunctionPlan, Plan, PoolPlan, RoutePlan};
use crate::ChainSpec;
use crate::GATEWAY_FN;

/// Parties a function has in the plan: one per instance it may scale to, and one more, so
/// that a live update can start a new instance before it drains an old one.
/// A function fused into another's instances (`fused_into`) has none.
pub fn reserved(f: &crate::FunctionSpec) -> usize {
    if f.fused_into.is_some() {
        return 0;
    }
    usize::from(f.scale.max.max(f.instances)) + 1
}

/// Builds the plan: functions in spec order, parties `0..gateways` the gateway's threads,
/// then each function's parties in order ([`reserved`]); headers the gateway copies are the union of
/// what functions ask for.
pub fn plan_from_spec(spec: &ChainSpec, transport: &str, spin_us: u32, gateways: u16) -> Plan {
    let index = |name: &str| {
        spec.functions
            .iter()
            .position(|f| f.name == name)
            .expect("spec validation guarantees every name exists") as u8
    };
    let functions = spec
        .functions
        .iter()
        .map(|f| FunctionPlan {
            name: f.name.clone(),
            concurrency: f.concurrency,
            next: f.next.iter().map(|n| index(n)).collect(),
            calls: f.calls.iter().map(|n| index(n)).collect(),
            fan_out: f.fan_out.iter().map(|n| index(n)).collect(),
            join: f.join,
            state: f.state,
            fused: if f.fused_with.is_empty() {
                Vec::new()
            } else {
                std::iter::once(index(&f.name))
                    .chain(f.fused_with.iter().map(|n| index(n)))
                    .collect()
            },
            host: f.fused_into.as_deref().map(index),
        })
        .collect();
    let routes = spec
        .routes
        .iter()
        .map(|r| RoutePlan {
            method: r.method.clone(),
            path: r.path.clone(),
            mqtt: r.mqtt.clone(),
            mqtt_reply: r.mqtt_reply.clone(),
            coap: r.coap.clone(),
            content_type: r.content_type.clone(),
            grpc: !r.grpc.is_empty(),
            sequence: r.sequence.iter().map(|n| index(n)).collect(),
            relay_of: r.relay_of.map(|i| i as u16),
        })
        .collect();
    let mut headers: Vec<String> = spec
        .functions
        .iter()
        .flat_map(|f| f.headers.iter().cloned())
        .collect();
    headers.sort();
    headers.dedup();
    let mut party_function = vec![GATEWAY_FN; usize::from(gateways.max(1))];
    for (i, f) in spec.functions.iter().enumerate() {
        // Every instance the function may scale to has its party (and queues) from the start.
        party_function.extend(std::iter::repeat_n(i as u8, reserved(f)));
    }
    let (large_slots, large_slot_size) = spec.pool.large(spec.max_body);
    Plan {
        chain: spec.name.clone(),
        transport: transport.to_owned(),
        spin_us,
        queue_capacity: spec.pool.slots.next_power_of_two().min(1024),
        functions,
        routes,
        headers,
        party_function,
        timeout_ms: spec.timeout.as_millis() as u64,
        state: spec.state,
        pool: PoolPlan {
            slots: spec.pool.slots,
            slot_size: spec.pool.slot_size,
            hugepages: spec.pool.hugepages,
            large_slots,
            large_slot_size,
        },
        cpus: spec.cpus.clone(),
    }
}
