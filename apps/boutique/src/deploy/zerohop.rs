//! The zerohop deployment: one function per service, all from the `boutique-fn` program.
//!
//! A function's handler runs the service's logic on its handler thread. Calls go through
//! `Request::call_all`, which blocks until every answer is in, so the logic's futures are
//! ready at once and [`run_ready`] drives them without an executor. Callee outputs are read
//! in place in their slots; the only copies are the request body (the logic owns its input
//! while the request is borrowed for calls) and the output written into the slot.

use zerohop_runtime::{Answer, HandlerError, Next, Request, State};

use crate::rpc::{run_ready, Peers, Service, ServiceError, Store, Update};
use crate::services::{self, frontend};

/// The output of a call, in its slot until dropped.
pub struct AnswerBody(Answer);

impl AsRef<[u8]> for AnswerBody {
    fn as_ref(&self) -> &[u8] {
        self.0.body()
    }
}

/// Calls through the request being handled.
pub struct RequestPeers<'r, 'a> {
    req: &'r mut Request<'a>,
}

impl Peers for RequestPeers<'_, '_> {
    type Output = AnswerBody;

    fn call_all(
        &mut self,
        calls: Vec<(Service, Vec<u8>)>,
    ) -> impl std::future::Future<Output = Vec<Result<AnswerBody, ServiceError>>> {
        let named: Vec<(&str, &[u8])> = calls
            .iter()
            .map(|(s, input)| (s.name(), input.as_slice()))
            .collect();
        let answers = self
            .req
            .call_all(&named)
            .into_iter()
            .map(|a| {
                a.map(AnswerBody)
                    .map_err(|e| ServiceError::new(e.status, e.message))
            })
            .collect();
        std::future::ready(answers)
    }
}

/// The chain's state store as the cart's [`Store`].
pub struct ChainStore<'a>(pub &'a State);

impl Store for ChainStore<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ServiceError> {
        Ok(self.0.get(key)?)
    }

    fn update(&self, key: &[u8], f: &mut Update<'_>) -> Result<Option<Vec<u8>>, ServiceError> {
        Ok(self.0.update(key, f)?)
    }
}

/// Handles one request as `service`.
pub fn handle(service: Service, req: &mut Request<'_>) -> Result<Next, HandlerError> {
    let out = match service {
        Service::Frontend => return frontend_page(req),
        Service::Cart => {
            let store = ChainStore(req.state()?);
            run_ready(services::handle(
                service,
                req.body(),
                &mut crate::rpc::NoPeers,
                Some(&store),
            ))
        }
        _ if service.calls().is_empty() => run_ready(services::handle(
            service,
            req.body(),
            &mut crate::rpc::NoPeers,
            None,
        )),
        _ => {
            let body = req.body().to_vec();
            run_ready(services::handle(
                service,
                &body,
                &mut RequestPeers { req },
                None,
            ))
        }
    };
    match out {
        Ok(bytes) => {
            req.set_body(&bytes)?;
            Ok(Next::Continue)
        }
        Err(e) => Err(e),
    }
}

/// Answers a page as the frontend: the route the request came in by (the spec's routes are
/// the frontend's patterns), its `{id}` and the headers the spec lists
/// ([`frontend::HEADERS`]); the answer's status and headers go to the client with it.
fn frontend_page(req: &mut Request<'_>) -> Result<Next, HandlerError> {
    let route = frontend::Route::from_pattern(req.method(), req.route_path()).ok_or_else(|| {
        HandlerError::not_found(format!("no page for {} {}", req.method(), req.route_path()))
    })?;
    let owned = |v: Option<&str>| v.map(str::to_owned);
    // The gateway gives cookies split over several fields as one line (HTTP/2 clients).
    let [cookie, referer, accept] = frontend::HEADERS.map(|name| owned(req.header(name)));
    let product_id = owned(req.param("id"));
    let body = req.body().to_vec();
    let page = frontend::PageRequest {
        route,
        product_id: product_id.as_deref(),
        cookie: cookie.as_deref(),
        referer: referer.as_deref(),
        accept: accept.as_deref(),
        body: &body,
    };
    let answer = run_ready(frontend::handle(&page, &mut RequestPeers { req }))?;
    req.set_body(&answer.body)?;
    if answer.status != 200 {
        req.set_status(answer.status)?;
    }
    for (name, value) in &answer.headers {
        req.add_response_header(name, value)?;
    }
    Ok(Next::Continue)
}

/// Serves `service` as this process's function until the agent stops it.
pub fn run(service: Service) -> ! {
    zerohop_runtime::run(move |req: &mut Request<'_>| handle(service, req))
}
