//! Why an instance could not start ([`StartError`]), and each way the agent's hand-over can
//! be inconsistent ([`HandOverError`]).

use zerohop_pool::PoolError;
use zerohop_spec::PlanError;
use zerohop_transport::{Backend, PartyId, PolicyError, TransportError};

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Not started by the agent.
    #[error(
        "{0} is not set: this program is a zerohop function; start it through its chain with \
         `zerohop up CHAIN.yaml`"
    )]
    NotUnderAgent(&'static str),
    /// The agent's hand-over is inconsistent.
    #[error("bad hand-over from the agent: {0}")]
    HandOver(#[from] HandOverError),
    /// The agent is already gone.
    #[error("the agent (pid {0}) is gone; exiting")]
    Orphan(u32),
    /// The pool could not be attached.
    #[error("attaching the pool: {0}")]
    Pool(#[from] PoolError),
    /// The transport could not be attached.
    #[error("attaching the transport: {0}")]
    Transport(#[from] TransportError),
}

/// How the agent's hand-over (its `ZEROHOP_*` environment and the descriptors it passed
/// down) does not fit together.
#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    /// The variable named holds something else than a number.
    #[error("{0} is not a number")]
    NotANumber(&'static str),
    /// `ZEROHOP_PLAN` holds no plan.
    #[error(transparent)]
    Plan(PlanError),
    /// The descriptor the agent was to pass down at this number is not open.
    #[error("fd {0} not inherited")]
    NotInherited(i32),
    /// The plan's transport is none this runtime knows.
    #[error("unknown transport {:?}; use one of: {}", .0, backend_names())]
    UnknownTransport(String),
    /// The plan's functions and parties make no policy.
    #[error(transparent)]
    Policy(PolicyError),
    /// The party to attach runs no function of the plan (or is the gateway's).
    #[error("party {0} runs no function")]
    NoFunction(PartyId),
    /// Fewer descriptors than the function has security domains (or it has none).
    #[error("{fds} inherited descriptors, but the function is in {domains} security domains")]
    TooFewDescriptors {
        /// How many descriptors were handed over.
        fds: usize,
        /// How many security domains the function is in.
        domains: usize,
    },
    /// The security domain's pool would start past the last slot a descriptor can name.
    #[error("security domain {0}'s pool is out of range")]
    PoolOutOfRange(usize),
    /// The function has state, but no descriptor was left for its state store.
    #[error("the function has state but no state store was handed over")]
    NoStateStore,
    /// No descriptor was left for the handler threads' progress records.
    #[error("no progress region was handed over")]
    NoProgress,
}

/// `ring, socket, poll, sockmap`: the transports a plan may name.
fn backend_names() -> String {
    Backend::ALL.map(Backend::name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_hand_over_says_what_is_wrong_as_before() {
        let cases = [
            (
                StartError::from(HandOverError::NotANumber("ZEROHOP_FDS")),
                "bad hand-over from the agent: ZEROHOP_FDS is not a number",
            ),
            (
                HandOverError::NotInherited(5).into(),
                "bad hand-over from the agent: fd 5 not inherited",
            ),
            (
                HandOverError::UnknownTransport("pigeon".into()).into(),
                "bad hand-over from the agent: unknown transport \"pigeon\"; use one of: ring, \
                 socket, poll, sockmap",
            ),
            (
                HandOverError::TooFewDescriptors { fds: 1, domains: 2 }.into(),
                "bad hand-over from the agent: 1 inherited descriptors, but the function is in 2 \
                 security domains",
            ),
            (
                HandOverError::PoolOutOfRange(3).into(),
                "bad hand-over from the agent: security domain 3's pool is out of range",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }

    #[test]
    fn an_unknown_transport_lists_what_the_plan_reader_lists() {
        let e = "pigeon".parse::<Backend>().unwrap_err();
        assert_eq!(
            format!("bad hand-over from the agent: {e}"),
            StartError::from(HandOverError::UnknownTransport("pigeon".into())).to_string()
        );
    }
}
