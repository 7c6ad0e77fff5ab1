//! A hostile chain beside the hello chain under load: the hostile function garbles its
//! chain's pool and its own queues, forges descriptors and scribbles statuses and lengths
//! over the slots it holds, all the time. The hello chain must not notice; the hostile
//! chain's gateway must answer every request with an HTTP status within its timeout; no
//! agent dies; after shutdown nothing of either chain is left.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{client, func, post, runtime, Answer};
use zerohop_agent::{spec, up, Running, UpOptions};
use zerohop_test_support::{
    alive, children, instances, memfds, signal_pid, target_bin, wait_until, ChainProcess, Signal,
};

fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Every process on the machine running as `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&p| uid_of(p) == Some(uid))
                .collect()
        })
        .unwrap_or_default()
}

/// Asks the `chaos` function at `url` for its report until one arrives (the report itself
/// may be lost to the chaos).
fn chaos_report(url: &str) -> Answer {
    let agent = client();
    (0..50)
        .map(|_| post(&agent, url, "report"))
        .find(|a| a.status == 200)
        .expect("one report arrives out of 50")
}

/// `workers` clients sending `n` requests each to the hello chain at `url`; each thread
/// panics on the first answer that is not exactly right.
/// Brings the chain of `yaml` (named `file` in errors) up in this process, its HTTP on a
/// free loopback port.
fn up_here(rt: &tokio::runtime::Runtime, file: &str, yaml: &str) -> Running {
    let opts = UpOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..UpOptions::default()
    };
    rt.block_on(up(spec::parse(Path::new(file), yaml).unwrap(), opts))
        .unwrap_or_else(|e| panic!("{file}: the chain did not come up: {e}"))
}

fn hello_load(url: &str, workers: u32, n: u32) -> Vec<JoinHandle<()>> {
    (0..workers)
        .map(|w| {
            let url = url.to_owned();
            std::thread::spawn(move || {
                let agent = client();
                for i in 0..n {
                    let a = post(&agent, &url, &format!("w{w} n{i}"));
                    assert_eq!(
                        (a.status, a.body.as_str()),
                        (200, format!("W{w} N{i}!").as_str())
                    );
                }
            })
        })
        .collect()
}

/// Two clients sending to the hostile route at `url` until `done` is set (at least 30
/// requests each); each thread panics when a request gets no HTTP status (the client gives
/// up after 30 s, far past the chain's 2 s timeout: a guard, not a measure). Answers are
/// counted by status class (`0xx..5xx`) in `statuses`.
fn hostile_load(
    url: &str,
    done: &Arc<AtomicBool>,
    statuses: &Arc<[AtomicU32; 6]>,
) -> Vec<JoinHandle<()>> {
    (0..2)
        .map(|_| {
            let (url, statuses, done) = (url.to_owned(), statuses.clone(), done.clone());
            std::thread::spawn(move || {
                let agent = client();
                let mut i = 0;
                while i < 30 || !done.load(Ordering::Relaxed) {
                    i += 1;
                    let (status, body) = match agent.post(&url).send_string(&format!("chaos {i}")) {
                        Ok(r) | Err(ureq::Error::Status(_, r)) => {
                            (r.status(), r.into_string().unwrap_or_default())
                        }
                        Err(e) => panic!(
                            "hostile request {i} got no HTTP answer (the gateway must \
                                 answer every request, at the latest when the chain's 2 s \
                                 timeout passes): {e}"
                        ),
                    };
                    assert!((200..600).contains(&status), "{status} {body}");
                    if statuses[(status / 100) as usize].fetch_add(1, Ordering::Relaxed) < 3 {
                        eprintln!("hostile route answered {status}: {}", body.trim_end());
                    }
                }
            })
        })
        .collect()
}

#[test]
fn a_hostile_chain_beside_the_hello_chain_under_load() {
    let _serial = crate::serial();
    let me = std::process::id();
    let rt = runtime();
    // The hello chain, in this process, so its pool can be inspected.
    let yaml = format!(
        "name: hello\nfunctions:\n{}{}routes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n",
        func("upper", "upper", "", ", concurrency: 4"),
        func("exclaim", "exclaim", "", ""),
    );
    let hello = up_here(&rt, "hello.yaml", &yaml);
    // The hostile chain, under its own agent: `chaos` in front, the upper-caser behind it.
    let hostile_spec = format!(
        "name: chaos\ntimeout: 2s\nfunctions:\n  chaos: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: chaos }}, concurrency: 4 }}\n{}routes:\n  - http: POST /x\n    sequence: [chaos, after]\n",
        target_bin("zerohop-hostile").display(),
        func("after", "upper", "", ""),
    );
    let hostile = ChainProcess::start(&hostile_spec, &[]);
    let hostile_kids = instances(hostile.pid());
    assert_eq!(hostile_kids.len(), 2, "two instances in the hostile chain");
    let hostile_uid = uid_of(hostile_kids[0]).expect("instance uid");

    // The read-only descriptors stay read-only.
    let report = chaos_report(&format!("{}/x", hostile.url));
    let lines: Vec<&str> = report
        .body
        .lines()
        .filter(|l| !l.is_empty() && !l.to_lowercase().starts_with("pool "))
        .collect();
    assert!(
        !lines.is_empty(),
        "the hostile function has read-only descriptors"
    );
    for line in lines {
        let l = line.to_lowercase();
        assert!(
            (l.starts_with("rw_map") || l.starts_with("reopen")) && !l.ends_with(" ok"),
            "{line}"
        );
    }

    // The attack starts shortly after the first request.
    std::thread::sleep(Duration::from_millis(600));

    let statuses: Arc<[AtomicU32; 6]> = Arc::new(Default::default());
    let hello_done = Arc::new(AtomicBool::new(false));
    let hostile_clients = hostile_load(&format!("{}/x", hostile.url), &hello_done, &statuses);
    let hello_clients = hello_load(&format!("{}/hello", hello.url()), 4, 1500);
    for c in hello_clients {
        c.join().expect("every hello request answered correctly");
    }
    hello_done.store(true, Ordering::Relaxed);
    for c in hostile_clients {
        c.join()
            .expect("every hostile request answered with a status in time");
    }
    let counted: Vec<u32> = statuses.iter().map(|s| s.load(Ordering::Relaxed)).collect();
    assert!(counted.iter().sum::<u32>() >= 60, "{counted:?}");
    eprintln!("hostile chain statuses by class (0xx..5xx): {counted:?}");

    // No agent died.
    assert!(alive(hostile.pid()), "the hostile chain's agent is alive");
    assert_eq!(hello.pools().in_use(), 0, "no slot left in hello's pool");
    assert_eq!(hello.gateways().inflight(), 0);

    // Shutdown: nothing of either chain left.
    let hostile_agent = hostile.pid();
    assert_eq!(hostile.stop(), Some(0), "the hostile chain stops cleanly");
    assert!(!alive(hostile_agent));
    for k in &hostile_kids {
        assert!(
            wait_until(Duration::from_secs(10), || !alive(*k)),
            "instance {k} left"
        );
    }
    // As root the chain has a uid of its own: nothing may run under it any more (this
    // covers anything its instances forked).
    if uid_of(me) == Some(0) {
        assert_ne!(hostile_uid, 0);
        assert!(
            wait_until(Duration::from_secs(10), || processes_of(hostile_uid)
                .is_empty()),
            "processes of the hostile chain left: {:?}",
            processes_of(hostile_uid)
        );
    }
    let hello_kids = children(me);
    rt.block_on(hello.shutdown());
    for k in hello_kids {
        assert!(
            wait_until(Duration::from_secs(5), || !alive(k)),
            "instance {k} left"
        );
    }
    assert!(children(me).is_empty(), "no child process left");
    assert!(memfds(me).is_empty(), "memfds left: {:?}", memfds(me));
}

/// One chain, two routes that share no function: `/hello` (upper, exclaim) and `/x` (the
/// hostile function alone). The routes are two security domains with a pool each, and the
/// hostile function is handed only its own: while it garbles that pool and its queues all
/// the time, every `/hello` request is answered correctly, every `/x` request gets a status
/// in time, and `/hello`'s pool ends with no slot in use.
#[test]
fn a_hostile_function_cannot_touch_another_route_of_its_chain() {
    let _serial = crate::serial();
    let rt = runtime();
    let yaml = format!(
        "name: mixed\ntimeout: 2s\nfunctions:\n{}{}  chaos: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: chaos }}, concurrency: 4 }}\nroutes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n  - http: POST /x\n    sequence: [chaos]\n",
        func("upper", "upper", "", ", concurrency: 4"),
        func("exclaim", "exclaim", "", ""),
        target_bin("zerohop-hostile").display(),
    );
    let chain = up_here(&rt, "mixed.yaml", &yaml);
    assert_eq!(
        chain.pools().len(),
        4,
        "per security domain a pool of small slots and one of large slots"
    );

    // The hostile function was handed its own route's pools only: domain 1's small and large.
    let report = chaos_report(&format!("{}/x", chain.url()));
    let pools: Vec<&str> = report
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("pool "))
        .collect();
    assert_eq!(pools.len(), 2, "{}", report.body);
    assert!(pools[0].contains("zerohop-pool:mixed:1 "), "{pools:?}");
    assert!(pools[1].contains("zerohop-pool:mixed:1:large"), "{pools:?}");
    std::thread::sleep(Duration::from_millis(600));

    let done = Arc::new(AtomicBool::new(false));
    let statuses: Arc<[AtomicU32; 6]> = Arc::new(Default::default());
    let hostile_clients = hostile_load(&format!("{}/x", chain.url()), &done, &statuses);
    let hello_clients = hello_load(&format!("{}/hello", chain.url()), 4, 1000);
    let hello_ok = hello_clients.into_iter().all(|c| c.join().is_ok());
    done.store(true, Ordering::Relaxed);
    let hostile_ok = hostile_clients.into_iter().all(|c| c.join().is_ok());
    assert!(
        hello_ok,
        "every /hello request answered correctly beside the attack"
    );
    assert!(
        hostile_ok,
        "every /x request answered with a status in time"
    );
    let answered: u32 = statuses.iter().map(|s| s.load(Ordering::Relaxed)).sum();
    assert!(answered >= 60);
    let hello_pool = chain.pools().iter().next().expect("domain 0").clone();
    assert!(
        wait_until(Duration::from_secs(5), || hello_pool.owners().in_use() == 0),
        "no slot left in /hello's pool"
    );
    rt.block_on(chain.shutdown());
    drop(hello_pool);
    let me = std::process::id();
    assert!(memfds(me).is_empty(), "memfds left: {:?}", memfds(me));
}

/// A function rewrites its pool's header (`slots_offset` near 2^64, which would put a later
/// party's slots outside its mapping) and aborts; the agent starts it again, and the other
/// function of its domain is killed and started again too. Each attaches with the geometry
/// of the plan, from a header the agent wrote anew before handing the pool over: the route
/// answers again, each instance restarted once (no crash loop of SIGSEGV or SIGBUS), and the
/// pool's header is the plan's.
#[test]
fn a_rewritten_pool_header_moves_no_party_that_attaches_later() {
    let _serial = crate::serial();
    let rt = runtime();
    let yaml = format!(
        "name: scribble\ntimeout: 2s\nfunctions:\n  h: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: header }} }}\n{}routes:\n  - http: POST /h\n    sequence: [h, upper]\n",
        target_bin("zerohop-hostile").display(),
        func("upper", "upper", "", ""),
    );
    let chain = up_here(&rt, "scribble.yaml", &yaml);
    let url = format!("{}/h", chain.url());
    let c = client();
    let hello = |c: &ureq::Agent| {
        let a = post(c, &url, "hello");
        (a.status, a.body)
    };
    assert_eq!(hello(&c), (200, "HELLO".to_owned()));
    let (h, u) = (chain.parties_of("h")[0], chain.parties_of("upper")[0]);
    let (h0, u0) = (chain.restarts(h), chain.restarts(u));

    let scribbled = post(&c, &url, "scribble");
    assert!(scribbled.status >= 500, "{scribbled:?}");
    assert!(
        wait_until(Duration::from_secs(10), || chain.restarts(h) > h0
            && chain.instance_pid(h).is_some()),
        "the scribbling instance was started again"
    );
    let victim = chain.instance_pid(u).expect("upper runs");
    signal_pid(victim, Signal::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || chain.restarts(u) > u0),
        "upper was started again"
    );
    assert!(
        wait_until(Duration::from_secs(10), || hello(&c)
            == (200, "HELLO".to_owned())),
        "the route answers again"
    );
    // Settled: each started again exactly once (an instance that attached a poisoned header
    // would die of SIGSEGV or SIGBUS, and again, and again).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(hello(&c), (200, "HELLO".to_owned()));
    assert_eq!((chain.restarts(h), chain.restarts(u)), (h0 + 1, u0 + 1));
    // The header is the plan's again: a party attaching now with the plan's geometry agrees.
    let pool = chain.pools().iter().next().expect("one pool").clone();
    let fd = pool.fd().try_clone_to_owned().unwrap();
    zerohop_pool::Pool::attach(fd, &pool.geometry()).expect("the header is the plan's");
    drop(pool);
    rt.block_on(chain.shutdown());
}

/// A function keeps half the owner words of its pool naming other instances of its chain
/// (of its own route, `tail`, and of another route, `upper` and `exclaim`), unchanged for
/// longer than the watchdog's limit, as a party stuck on a slot would look. The watchdog
/// believes only what each instance says about itself: while `/hello` is under load,
/// no instance is killed or restarted, and every `/hello` request is answered correctly.
#[test]
fn forged_owner_words_get_no_other_instance_killed() {
    let _serial = crate::serial();
    let rt = runtime();
    let yaml = format!(
        "name: owners\ntimeout: 1s\nfunctions:\n{}{}{}  evil: {{ command: [\"{}\"], env: {{ HOSTILE_MODE: owners, HOSTILE_FORGE_MS: \"5000\" }} }}\nroutes:\n  - http: POST /hello\n    sequence: [upper, exclaim]\n  - http: POST /evil\n    sequence: [evil, tail]\n",
        func("upper", "upper", "", ", concurrency: 4"),
        func("exclaim", "exclaim", "", ""),
        func("tail", "exclaim", "", ""),
        target_bin("zerohop-hostile").display(),
    );
    let chain = up_here(&rt, "owners.yaml", &yaml);
    let (hello, evil) = (
        format!("{}/hello", chain.url()),
        format!("{}/evil", chain.url()),
    );
    let c = client();
    assert_eq!(post(&c, &hello, "hi").body, "HI!");
    // `evil` answers, `tail` appends its `!`.
    assert_eq!(post(&c, &evil, "ping").body, "alive\n!");
    let victims: Vec<u16> = ["upper", "exclaim", "tail"]
        .iter()
        .flat_map(|f| chain.parties_of(f))
        .collect();
    let before: Vec<(Option<u32>, u32)> = victims
        .iter()
        .map(|&p| (chain.instance_pid(p), chain.restarts(p)))
        .collect();
    assert!(before.iter().all(|(pid, _)| pid.is_some()), "{before:?}");

    let forged = post(&c, &evil, "forge");
    let words: usize = forged
        .body
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("forging "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{forged:?}"));
    assert!(words > 0, "{forged:?}");
    // Past the watchdog's limit (timeout 1 s + grace 1 s) plus samples, with requests in
    // flight all the time so that it samples.
    let until = Instant::now() + Duration::from_secs(4);
    let mut n = 0;
    while Instant::now() < until {
        let a = post(&c, &hello, &format!("n{n}"));
        assert_eq!(
            (a.status, a.body.as_str()),
            (200, format!("N{n}!").as_str())
        );
        n += 1;
    }
    let after: Vec<(Option<u32>, u32)> = victims
        .iter()
        .map(|&p| (chain.instance_pid(p), chain.restarts(p)))
        .collect();
    assert_eq!(
        after, before,
        "no instance was killed for a forged owner word"
    );
    rt.block_on(chain.shutdown());
}
