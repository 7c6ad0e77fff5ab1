//! Loading the verdict program and filling its maps (agent side), with aya.

use std::os::fd::{AsRawFd, OwnedFd};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, SockMap};
use aya::programs::SkMsg;
use aya::{Ebpf, EbpfLoader};

use super::abi::{self, Config, FnStats, SenderEntry};
use crate::{Policy, TransportError};

/// The compiled program (`build.rs`); empty when the build had no clang.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap.bpf.o"));

/// The eBPF counters of a chain: per function index (the gateway's is 255), and for
/// senders the program did not know.
#[derive(Clone, Debug)]
pub struct KernelCounters {
    /// By function index, 256 rows.
    pub functions: Vec<FnStats>,
    /// Messages from sockets the agent did not register.
    pub unknown: FnStats,
}

/// The loaded program and its maps; dropping it closes every descriptor of them, which
/// unloads them (nothing is pinned).
pub(crate) struct Kernel {
    /// Holds the verdict program and its attachment.
    _ebpf: Ebpf,
    stats: PerCpuArray<MapData, FnStats>,
    /// The function indices the chain uses (the gateway's included): the counter rows worth
    /// reading.
    rows: Vec<u8>,
    _socks: SockMap<MapData>,
}

/// Refuses early, in one line, where the programs cannot possibly load.
pub(crate) fn preflight() -> Result<(), TransportError> {
    if OBJECT.is_empty() {
        return Err(TransportError::Unsupported(
            "this zerohop was built without clang, so it has no eBPF programs; install clang \
             and rebuild"
                .into(),
        ));
    }
    Ok(())
}

/// Names what is missing from the error of a load step.
fn refusal(step: &str, e: &(dyn std::error::Error + 'static)) -> TransportError {
    let chain: Vec<&(dyn std::error::Error + 'static)> =
        std::iter::successors(Some(e), |c| c.source()).collect();
    let errno = chain
        .iter()
        .rev()
        .find_map(|c| c.downcast_ref::<std::io::Error>()?.raw_os_error());
    let root = chain.last().expect("starts with e");
    let text = if chain.len() > 1 {
        format!("{e}: {root}")
    } else {
        e.to_string()
    };
    let what = match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "loading eBPF programs needs CAP_BPF and CAP_NET_ADMIN (run the agent as root)"
                .to_owned()
        }
        Some(libc::ENOSYS) => "this kernel has no bpf() system call (CONFIG_BPF_SYSCALL)".into(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) if step.contains("map") => {
            "this kernel lacks BPF sockmap support (CONFIG_BPF_STREAM_PARSER)".into()
        }
        _ => format!("{step} failed: {text}"),
    };
    TransportError::Unsupported(what)
}

fn failed(step: &'static str) -> impl Fn(aya::maps::MapError) -> TransportError {
    move |e| refusal(step, &e)
}

impl Kernel {
    /// Loads the program for `policy`, attaches it to the sockmap, fills the maps and puts
    /// each party's socket (`socks[p]`, local port `ports[p]`) in the sockmap.
    pub(crate) fn load(
        policy: &Policy,
        socks: &[&OwnedFd],
        ports: &[u16],
    ) -> Result<Self, TransportError> {
        let parties = u32::from(policy.parties());
        let edges: Vec<(u8, u8)> = policy.edges().collect();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("zh_socks", parties)
            .map_max_entries("zh_senders", parties)
            .map_max_entries("zh_party_fn", parties)
            .map_max_entries("zh_instances", parties)
            .map_max_entries("zh_policy", (edges.len() as u32).max(1))
            .load(OBJECT)
            .map_err(|e| refusal("creating the eBPF maps", &e))?;

        let socks_map: SockMap<MapData> = take(&mut ebpf, "zh_socks")?;
        let prog: &mut SkMsg = ebpf
            .program_mut("zh_verdict")
            .ok_or_else(|| layout("no program zh_verdict in the object"))?
            .try_into()
            .map_err(|e| refusal("loading the verdict program", &e))?;
        prog.load()
            .map_err(|e| refusal("loading the verdict program", &e))?;
        let map_fd = socks_map
            .fd()
            .try_clone()
            .map_err(|e| refusal("attaching the verdict program", &e))?;
        prog.attach(&map_fd)
            .map_err(|e| refusal("attaching the verdict program", &e))?;

        let mut config: Array<MapData, Config> = take(&mut ebpf, "zh_config")?;
        let gateways = policy.parties_of(crate::GATEWAY_FN).count() as u32;
        config
            .set(0, Config { gateways, parties }, 0)
            .map_err(failed("filling zh_config"))?;

        let mut party_fn: Array<MapData, u32> = take(&mut ebpf, "zh_party_fn")?;
        let mut senders: HashMap<MapData, u32, SenderEntry> = take(&mut ebpf, "zh_senders")?;
        for p in 0..policy.parties() {
            let f = policy.function_of(p).expect("in range");
            party_fn
                .set(u32::from(p), u32::from(f), 0)
                .map_err(failed("filling zh_party_fn"))?;
            let entry = SenderEntry {
                party: p,
                function: f,
                reserved: 0,
            };
            senders
                .insert(u32::from(ports[p as usize]), entry, 0)
                .map_err(failed("filling zh_senders"))?;
        }

        let mut allowed: HashMap<MapData, u32, u8> = take(&mut ebpf, "zh_policy")?;
        for (from, to) in edges {
            allowed
                .insert(abi::edge_key(from.into(), to.into()), 1, 0)
                .map_err(failed("filling zh_policy"))?;
        }

        let mut counts: Array<MapData, u32> = take(&mut ebpf, "zh_fn_count")?;
        let mut instances: HashMap<MapData, u32, u32> = take(&mut ebpf, "zh_instances")?;
        for f in 0..=255u8 {
            let mut n = 0u32;
            for p in policy.parties_of(f).take(abi::MAX_INSTANCES as usize) {
                instances
                    .insert(abi::instance_key(f.into(), n), u32::from(p), 0)
                    .map_err(failed("filling zh_instances"))?;
                n += 1;
            }
            if n > 0 {
                counts
                    .set(u32::from(f), n, 0)
                    .map_err(failed("filling zh_fn_count"))?;
            }
        }

        let mut socks_map = socks_map;
        for (p, s) in socks.iter().enumerate() {
            socks_map
                .set(p as u32, &s.as_raw_fd(), 0)
                .map_err(failed("putting a socket in the sockmap"))?;
        }
        let stats = take(&mut ebpf, "zh_stats")?;
        let rows = (0..=255u8)
            .filter(|&f| policy.parties_of(f).next().is_some())
            .collect();
        Ok(Self {
            _ebpf: ebpf,
            stats,
            rows,
            _socks: socks_map,
        })
    }

    /// The counters now, summed over CPUs.
    pub(crate) fn counters(&self) -> Result<KernelCounters, aya::maps::MapError> {
        let row = |i: u32| -> Result<FnStats, aya::maps::MapError> {
            let mut sum = FnStats::default();
            for v in self.stats.get(&i, 0)?.iter() {
                sum.add(v);
            }
            Ok(sum)
        };
        // Rows of function indices the chain does not use stay zero: not read.
        let mut functions = vec![FnStats::default(); 256];
        for &f in &self.rows {
            functions[usize::from(f)] = row(u32::from(f))?;
        }
        Ok(KernelCounters {
            functions,
            unknown: row(abi::UNKNOWN_SENDER)?,
        })
    }
}

fn layout(what: &str) -> TransportError {
    TransportError::Layout(format!("the sockmap eBPF object: {what}"))
}

/// Takes map `name` out of `ebpf` as the typed map `T`.
fn take<T>(ebpf: &mut Ebpf, name: &str) -> Result<T, TransportError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| layout(&format!("no map {name}")))?;
    T::try_from(map).map_err(|e| layout(&format!("map {name}: {e}")))
}
