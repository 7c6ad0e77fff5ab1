//! How the agent hands a chain to an instance process: environment variables plus inherited
//! descriptors starting at [`FIRST_FD`] (the pools, then the state store, then the
//! transport's). The plan itself travels in [`PLAN`]; `docs/protocol.md` is the reference.

/// The chain's plan, JSON.
pub const PLAN: &str = "ZEROHOP_PLAN";
/// This instance's party index.
pub const PARTY: &str = "ZEROHOP_PARTY";
/// Number of inherited descriptors starting at [`FIRST_FD`].
pub const FDS: &str = "ZEROHOP_FDS";
/// Pid of the agent; the instance exits when the agent goes away.
pub const AGENT_PID: &str = "ZEROHOP_AGENT_PID";
// Descriptors, in order: the pools of the function's security domains, then the chain's
// state store if the function has `state`, then the transport's.
/// First inherited descriptor.
pub const FIRST_FD: i32 = 3;
