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
//! * `request{id, route}`: the request the thread is handling (and routing the output of),
//!   so whatever the handler logs names the request: `id` is the request's number as the
//!   gateway's logs show it, `route` the index of the route it entered by. It is written
//!   like a span but is none: a span per request cost a fifth of a pass-through function's
//!   CPU (the subscriber formats a span's fields when the span is made, logged or not), so
//!   the runtime only notes the request in a thread-local and the line format writes it
//!   after the root span, for every line at any level. A subscriber a program installs
//!   itself does not see it.
//!
//! The filter comes from `RUST_LOG` (tracing-subscriber's `EnvFilter` syntax), `info` when
//! unset or invalid. A program that installed a subscriber of its own before [`crate::run`]
//! keeps it (the SDK's is installed with `try_init`); records of the `log` crate go through
//! the same subscriber.

use std::cell::Cell;
use std::fmt;

use tracing::{Event, Span, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
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
        .with_ansi(false)
        .event_format(Line)
        .finish()
}

thread_local! {
    /// The request this thread handles: its id and route (see the module docs).
    static REQUEST: Cell<Option<(u32, u16)>> = const { Cell::new(None) };
}

/// The request a thread handles, noted until dropped (what was noted before comes back).
pub(crate) struct RequestScope {
    before: Option<(u32, u16)>,
}

impl Drop for RequestScope {
    fn drop(&mut self) {
        REQUEST.with(|r| r.set(self.before));
    }
}

/// A line: level, the spans from the root with the request after the root one, the event.
struct Line;

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(w, "{:>5} ", event.metadata().level())?;
        let request = REQUEST.with(Cell::get);
        let write_request = |w: &mut Writer<'_>| match request {
            Some((id, route)) => write!(w, "request{{id={id} route={route}}}:"),
            None => Ok(()),
        };
        let mut spans = 0;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                write!(w, "{}", span.name())?;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>() {
                    if !fields.is_empty() {
                        write!(w, "{{{fields}}}")?;
                    }
                }
                w.write_char(':')?;
                if spans == 0 {
                    write_request(&mut w)?;
                }
                spans += 1;
            }
        }
        if spans == 0 {
            write_request(&mut w)?;
        }
        if spans > 0 || request.is_some() {
            w.write_char(' ')?;
        }
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
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

/// Notes the request this thread handles (its number and the index of the route it entered
/// by) until the scope drops: two thread-local stores, no span.
#[inline]
pub(crate) fn request_span(request: u32, route: u16) -> RequestScope {
    RequestScope {
        before: REQUEST.with(|r| r.replace(Some((request, route)))),
    }
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
            let _req = request_span(65537, 2);
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
    fn stricter_filters_keep_the_root_and_the_request() {
        let out = Captured::default();
        tracing::subscriber::with_default(subscriber(out.clone(), EnvFilter::new("warn")), || {
            let _root = instance_span("hello", "upper", 3).entered();
            {
                let _req = request_span(7, 0);
                tracing::info!("dropped");
                tracing::warn!("kept");
            }
            tracing::warn!("after the request");
        });
        assert_eq!(
            out.text(),
            " WARN zerohop{chain=hello function=upper instance=3}:request{id=7 route=0}: kept\n \
             WARN zerohop{chain=hello function=upper instance=3}: after the request\n"
        );
    }

    #[test]
    fn a_line_without_spans_is_level_and_event() {
        let out = Captured::default();
        tracing::subscriber::with_default(subscriber(out.clone(), EnvFilter::new("info")), || {
            tracing::error!(code = 3, "alone");
            let _req = request_span(9, 1);
            tracing::info!("in a request");
        });
        assert_eq!(
            out.text(),
            "ERROR alone code=3\n INFO request{id=9 route=1}: in a request\n"
        );
    }
}
