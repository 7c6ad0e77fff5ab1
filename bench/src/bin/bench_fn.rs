//! `zerohop-bench-fn`: the baselines' HTTP function server. It applies its steps to the
//! request body in-process and either answers with the result (`monolith`, the last hop of
//! a chain) or POSTs it to the next hop and relays that answer (`http-chain`, and through
//! nginx for `nginx-broker`).
//!
//! Built on the same HTTP library as zerohop's gateway (hyper 1, HTTP/1.1 keep-alive,
//! `TCP_NODELAY`), so the comparison measures the architecture, not the HTTP stack. Prints
//! `listening on http://ADDR` as its first stdout line once it accepts connections; stops on
//! SIGTERM or SIGINT.

#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use zerohop_bench::Step;

/// Largest request body (and next hop's answer) accepted. The matrix sends at most 1 MiB,
/// but `zerohop-bench-large` sends 256 MiB through the monolith and the HTTP chain beside
/// zerohop (whose `max_body` it sets to 300 MiB), so the baselines take as much.
const MAX_BODY: usize = 300 << 20;
/// How long the next hop may take before the client gets 502 (zerohop's default timeout).
const NEXT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(
    name = "zerohop-bench-fn",
    about = "HTTP function server of the benchmark baselines (monolith, http-chain, nginx-broker)"
)]
struct Args {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long)]
    listen: SocketAddr,
    /// Steps applied in order to each request body: upper, exclaim, pass.
    #[arg(long, value_delimiter = ',', required = true, value_parser = parse_step)]
    steps: Vec<Step>,
    /// POST the result here and answer with what it answers (status and body).
    #[arg(long)]
    next: Option<Uri>,
    /// Worker threads: 1 (the default) runs one current-thread runtime, as every baseline
    /// of the one-core matrix; more runs tokio's multi-threaded runtime with that many
    /// workers (the hyper monolith of the multi-core point, on as many cores).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
}

fn parse_step(s: &str) -> Result<Step, String> {
    Step::parse(s).ok_or_else(|| format!("unknown step `{s}`; known: upper, exclaim, pass"))
}

type Answer = Response<Full<Bytes>>;

struct Server {
    steps: Vec<Step>,
    next: Option<(Uri, Client<HttpConnector, Full<Bytes>>)>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // One core, like zerohop's gateway (also a tokio current-thread runtime): every system
    // gets one thread per process, so the comparison is per process, not per thread pool.
    // The multi-core point asks for as many workers as it gives cores.
    let mut builder = if args.threads > 1 {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(usize::from(args.threads));
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("zerohop-bench-fn: cannot build the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zerohop-bench-fn: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> std::io::Result<()> {
    let (mut term, mut int) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    let listener = TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let next = args.next.map(|uri| {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // Pooled keep-alive connections to the next hop, reused across requests.
        let client = Client::builder(TokioExecutor::new()).build(connector);
        (uri, client)
    });
    let server = Arc::new(Server {
        steps: args.steps,
        next,
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on http://{addr}")?;
    out.flush()?;
    drop(out);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let server = server.clone();
                let svc = service_fn(move |req| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(server.handle(req).await) }
                });
                let conn = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        }
    }
}

impl Server {
    async fn handle(&self, req: Request<Incoming>) -> Answer {
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body larger than {MAX_BODY} bytes"),
                )
            }
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the request body: {e}"),
                )
            }
        };
        let mut body = Vec::from(body);
        for step in &self.steps {
            step.apply(&mut body);
        }
        match &self.next {
            None => Response::new(Full::new(Bytes::from(body))),
            Some((uri, client)) => match forward(client, uri, body).await {
                Ok(answer) => answer,
                Err(e) => text(
                    StatusCode::BAD_GATEWAY,
                    format!("next hop {uri} failed: {e}"),
                ),
            },
        }
    }
}

/// POSTs `body` to the next hop and turns its answer into ours.
async fn forward(
    client: &Client<HttpConnector, Full<Bytes>>,
    uri: &Uri,
    body: Vec<u8>,
) -> Result<Answer, String> {
    let req = Request::post(uri.clone())
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| error_chain(&e))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("reading its answer: {e}"))?
            .to_bytes();
        let mut answer = Response::new(Full::new(body));
        *answer.status_mut() = status;
        Ok(answer)
    };
    tokio::time::timeout(NEXT_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {NEXT_TIMEOUT:?}"))?
}

/// An error with its sources on one line (hyper-util's top-level error alone says little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// A one-line plain-text error answer.
fn text(status: StatusCode, line: String) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(line.replace('\n', " ") + "\n")));
    *answer.status_mut() = status;
    answer
}
