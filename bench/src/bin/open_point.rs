//! One open-loop point against a running hello chain, for investigating tail latency
//! (for example under `perf sched record`): `zerohop-bench-open URL RATE [SECONDS]`.
//! Latency is measured from each request's intended send time, as in the benchmark.

use std::process::ExitCode;
use std::time::Duration;

use zerohop_bench::loadgen::{run, BodyMix, Load};
use zerohop_bench::HELLO;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, rate, secs) = match args.as_slice() {
        [url, rate] => (url, rate.parse::<f64>().ok(), Some(3)),
        [url, rate, secs] => (url, rate.parse::<f64>().ok(), secs.parse::<u64>().ok()),
        _ => (&String::new(), None, None),
    };
    let (Some(rate), Some(secs)) = (rate.filter(|r| *r > 0.0), secs) else {
        eprintln!("usage: zerohop-bench-open URL RATE [SECONDS]   (e.g. http://127.0.0.1:8080/hello 50000)");
        return ExitCode::from(2);
    };
    let load = Load::Open {
        rate,
        connections: 64,
    };
    match run(
        url,
        &HELLO,
        &BodyMix::Fixed(100),
        &load,
        Duration::from_millis(500),
        Duration::from_secs(secs),
    ) {
        Ok(r) => {
            println!(
                "{:.0} requests/s, p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us, {} errors, {} wrong",
                r.rps,
                r.latency.p50_us,
                r.latency.p99_us,
                r.latency.p999_us,
                r.latency.max_us,
                r.errors,
                r.wrong
            );
            ExitCode::from(u8::from(r.errors > 0 || r.wrong > 0))
        }
        Err(e) => {
            eprintln!("zerohop-bench-open: {e:#}");
            ExitCode::FAILURE
        }
    }
}
