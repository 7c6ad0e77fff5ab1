//! How a function logs: `tracing` events, one line each on standard error.
//!
//! The agent reads every instance's standard error, stamps each line with the time and files
//! it under the function and instance, so a line here carries neither a time stamp nor
//! colours (it goes to a pipe), only the level, the spans and the event:
//!
//! ```text
//!  INFO zerohop{chain=hello function=upper instance=1}:request{id=65537 route=0}: upper-casing bytes=11
//! ```
//!
//! * `zerohop{chain, function, instance}`: the instance's root span (`instance` is its
//!   party number, the one the agent's logs and status show). It is an ERROR-level span so
//!   that it is there whatever `RUST_LOG` lets through; it is entered on every thread that
//!   handles requests.
//! * `request{id, route}`: one per request handled, entered while the handler runs (and
//!   while the runtime routes its output), so whatever the handler logs names the request:
//!   `id` is the request's number as the gateway's logs show it, `route` the index of the
//!   route it entered by. An INFO span: with `RUST_LOG=warn` or stricter it is not created
//!   at all (nothing per request is spent on it) and lines carry only the root span.
//!
//! The filter comes from `RUST_LOG` (tracing-subscriber's `EnvFilter` syntax), `info` when
//! unset or invalid. A program that installed a subscriber of its own before [`crate::run`]
//! keeps it (the SDK's is installed with `try_init`); records of the `log` crate go through
//! the same subscriber.

use tracing::Span;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use zerohop_transport::PartyId;

/// The filter when `RUST_LOG` is unset or does not parse.
const DEFAULT_FILTER: &str = "info";

/// The SDK's subscriber: one line per event to `writer`, filtered by `filter`, without time
/// or colours.
pub(crate) fn subscriber<W>(writer: W, filter: EnvFilter) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter)
        .without_time()
        .with_ansi(false)
        .with_target(false)
        .finish()
}

/// Installs the SDK's subscriber (standard error, `RUST_LOG`) as the process's default,
/// unless the program installed one already.
pub(crate) fn init() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // Err: a subscriber (or a `log` logger) is already installed; the program's wins.
    let _ = subscriber(std::io::stderr, filter).try_init();
}

/// The root span of instance `party` of `function` in `chain`.
pub(crate) fn instance_span(chain: &str, function: &str, party: PartyId) -> Span {
    tracing::error_span!("zerohop", chain = %chain, function = %function, instance = party)
}

/// The span of one request: its number and the index of the route it entered by.
#[inline]
pub(crate) fn request_span(request: u32, route: u16) -> Span {
    tracing::info_span!("request", id = request, route)
}

/// The span of one step of a fused group: the function whose handler runs (the instance's
/// root span names the whole group, `upper+exclaim`).
#[inline]
pub(crate) fn step_span(function: &str) -> Span {
    tracing::info_span!("step", function = %function)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A `MakeWriter` into memory, for reading what a subscriber wrote.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;

        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn a_line_is_level_spans_and_event_without_time_or_colour() {
        let out = Captured::default();
        tracing::subscriber::with_default(subscriber(out.clone(), EnvFilter::new("info")), || {
            let _root = instance_span("hello", "upper", 3).entered();
            let _req = request_span(65537, 2).entered();
            tracing::info!(bytes = 11, "upper-casing");
            tracing::debug!("below the filter");
        });
        assert_eq!(
            out.text(),
            " INFO zerohop{chain=hello function=upper instance=3}:request{id=65537 \
             route=2}: upper-casing bytes=11\n"
        );
    }

    #[test]
    fn stricter_filters_drop_the_request_span_but_keep_the_root() {
        let out = Captured::default();
        tracing::subscriber::with_default(subscriber(out.clone(), EnvFilter::new("warn")), || {
            let _root = instance_span("hello", "upper", 3).entered();
            let req = request_span(7, 0);
            assert!(req.is_disabled(), "no span per request at warn");
            let _req = req.entered();
            tracing::info!("dropped");
            tracing::warn!("kept");
        });
        assert_eq!(
            out.text(),
            " WARN zerohop{chain=hello function=upper instance=3}: kept\n"
        );
    }
}
