//! A request whose handler finishes later, on any thread ([`Deferred`]): for a party
//! whose work waits on something else, so that no thread waits with it.

use std::sync::Arc;

use super::dispatch::{run_handler, Dispatcher, Taken};
use crate::logging;
use crate::request::{HandlerError, Next, Request};

/// A request whose handler finishes later, on any thread: see
/// [`Instance::serve_deferred`](crate::Instance::serve_deferred). Dropping it unfinished
/// answers the request 500.
#[doc(hidden)]
pub struct Deferred {
    pub(super) router: Arc<Dispatcher>,
    pub(super) taken: Option<Taken>,
}

impl Deferred {
    /// The request as a handler sees it, without calls or state.
    pub fn request(&mut self) -> Request<'_> {
        let t = self.taken.as_mut().expect("an unfinished request");
        Request {
            slot: &mut t.slot,
            header: t.header,
            len: t.desc.len as usize,
            plan: &self.router.plan,
            function: self.router.function,
            calls: None,
            branches: Vec::new(),
            state: None,
            pools: &self.router.pools,
        }
    }

    /// Finishes the request as a handler returning what `f` returns would (`f` sees
    /// [`Deferred::request`]): the request goes on along its route, back to its caller, or
    /// its error to the client.
    pub fn finish(mut self, f: impl FnOnce(&mut Request<'_>) -> Result<Next, HandlerError>) {
        let router = self.router.clone();
        let _root = router.span.clone().entered();
        let (request, route) = {
            let h = &self.taken.as_ref().expect("an unfinished request").header;
            (h.request, h.route)
        };
        let _request = logging::request_span(request, route);
        let mut req = self.request();
        let outcome = run_handler(|| f(&mut req));
        let (len, header) = (req.len, req.header);
        let t = self.taken.take().expect("an unfinished request");
        router.finish(t, header, len, outcome);
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(t) = self.taken.take() {
            let header = t.header;
            let len = t.desc.len as usize;
            self.router.finish(
                t,
                header,
                len,
                Err(HandlerError::internal(
                    "the request was dropped without an answer",
                )),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use zerohop_pool::{Owner, Pool};

    use super::*;
    use crate::instance::testing::{request, upper, Kept};

    /// A request with body `body` taken by upper's instance to finish later, and what the
    /// runtime sends.
    fn deferred(body: &[u8]) -> (Deferred, Kept, Arc<Pool>) {
        let kept = Kept::default();
        let (router, pool) = upper(&kept, "runtime-deferred-test");
        let router = Arc::new(router);
        let taken = router.take(request(&pool, body)).expect("taken");
        let d = Deferred {
            router,
            taken: Some(taken),
        };
        (d, kept, pool)
    }

    #[test]
    fn a_deferred_request_finished_on_another_thread_goes_on_along_its_route() {
        let (mut d, kept, pool) = deferred(b"hello");
        let r = d.request();
        assert_eq!((r.body(), r.route_index()), (&b"hello"[..], 0));
        std::thread::spawn(move || {
            d.finish(|req| {
                req.set_body(b"HELLO, LATER")?;
                Ok(Next::Continue)
            })
        })
        .join()
        .unwrap();
        let sent = kept.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "one descriptor, on to exclaim");
        assert_eq!((sent[0].0, sent[0].1.next, sent[0].1.len), (2, 1, 12));
        let (_, slot, _) = pool.take(&sent[0].1, Owner::party(2), |_| true).unwrap();
        assert_eq!(&slot.data()[..12], b"HELLO, LATER");
    }

    #[test]
    fn a_deferred_request_dropped_unfinished_is_answered_500_once() {
        let (d, kept, pool) = deferred(b"hello");
        drop(d);
        let sent = kept.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "exactly one answer");
        assert_eq!(sent[0].0, 0, "to the gateway");
        let (_, slot, header) = pool.take(&sent[0].1, Owner::party(0), |_| true).unwrap();
        assert_eq!(header.status, 500);
        let text = String::from_utf8_lossy(&slot.data()[..sent[0].1.len as usize]).into_owned();
        assert!(text.contains("dropped without an answer"), "{text}");
    }
}
