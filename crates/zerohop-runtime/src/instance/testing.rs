//! What the instance's unit tests share: a sender that keeps what it is given, a
//! two-function chain, its first function's dispatcher, and a request for it.

use std::sync::{Arc, Mutex};

use zerohop_pool::{Descriptor, Owner, Pool, PoolGeometry, Pools, SlotHeader};
use zerohop_transport::{
    Delivery, FunctionPlan, PartyId, Picker, Plan, RoutePlan, SendError, Sender, GATEWAY_FN,
};

use super::dispatch::Dispatcher;
use crate::logging;

/// Keeps what the runtime sends instead of sending it.
#[derive(Clone, Default)]
pub(super) struct Kept(pub(super) Arc<Mutex<Vec<(PartyId, Descriptor)>>>);

impl Sender for Kept {
    fn send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        self.0.lock().unwrap().push((to, desc));
        Ok(())
    }

    fn try_send(&self, to: PartyId, desc: Descriptor) -> Result<(), SendError> {
        self.send(to, desc)
    }
}

/// `POST /hello` through upper (party 1) then exclaim (party 2); the gateway is party 0.
pub(crate) fn hello() -> Plan {
    let function = |name: &str| FunctionPlan {
        name: name.into(),
        concurrency: 1,
        ..Default::default()
    };
    Plan {
        chain: "hello".into(),
        transport: "ring".into(),
        spin_us: 0,
        queue_capacity: 8,
        functions: vec![function("upper"), function("exclaim")],
        routes: vec![RoutePlan {
            method: "POST".into(),
            path: "/hello".into(),
            sequence: vec![0, 1],
            ..Default::default()
        }],
        headers: Vec::new(),
        party_function: vec![GATEWAY_FN, 0, 1],
        cpus: Vec::new(),
        timeout_ms: 1000,
        state: None,
        pool: zerohop_transport::PoolPlan {
            slots: 64,
            slot_size: 4096,
            hugepages: false,
            large_slots: 0,
            large_slot_size: 0,
        },
    }
}

/// `hello` with upper and exclaim fused (`fuse: [[upper, exclaim]]`): party 1 runs both.
pub(crate) fn hello_fused() -> Plan {
    let mut plan = hello();
    plan.functions[0].fused = vec![0, 1];
    plan.functions[1].host = Some(0);
    plan.party_function = vec![GATEWAY_FN, 0];
    plan
}

/// Upper's router (party 1 of `hello`), sending into `kept`, with a pool named `name`.
pub(super) fn upper(kept: &Kept, name: &str) -> (Dispatcher, Arc<Pool>) {
    router_of(hello(), kept, name)
}

/// Party 1's router in `plan` (it runs function 0), sending into `kept`, with a pool named
/// `name`.
pub(super) fn router_of(plan: Plan, kept: &Kept, name: &str) -> (Dispatcher, Arc<Pool>) {
    let pool = Arc::new(
        Pool::create(
            name,
            &PoolGeometry {
                slots: 4,
                first_slot: 0,
                slot_size: 4096,
                max_parties: 3,
                hugepages: false,
                release: false,
            },
        )
        .unwrap(),
    );
    let router = Dispatcher {
        span: logging::instance_span(&plan.chain, &plan.group_name(0), 1),
        picker: Picker::new(&plan, 1),
        ids: plan.request_ids(),
        sender: Box::new(kept.clone()),
        plan: Arc::new(plan),
        pools: Pools::single(pool.clone()),
        function: 0,
        me: 1,
        state: None,
        progress: None,
    };
    (router, pool)
}

/// Request 65537 with body `body`, as the gateway hands it to upper.
pub(super) fn request(pool: &Arc<Pool>, body: &[u8]) -> Delivery {
    let mut slot = pool.alloc(Owner::party(1)).unwrap();
    let header = SlotHeader {
        request: 65537,
        ..SlotHeader::default()
    };
    slot.set_header(&header);
    slot.data_mut()[..body.len()].copy_from_slice(body);
    let desc = slot.descriptor(65537, body.len() as u32, 0);
    Delivery {
        from: 0,
        desc,
        slot,
        header,
        refused: false,
    }
}
