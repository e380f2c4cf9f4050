//! The measurements every peer gets alike: connection setup in interleaved rounds (one
//! batch per cell and round, the cells in a new random order every round), and one iperf3
//! stream.
use std::{
    collections::BTreeMap,
    ffi::CString,
    fmt::Debug,
    fs::File,
    net::{Ipv4Addr, SocketAddrV4},
    os::unix::process::CommandExt as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use super::{
    client::{BatchResult, Client, Place},
    netns::in_netns,
    server::Servers,
};

/// Connection setup times of one cell (a peer and a service).
#[derive(Clone, Default)]
pub struct Cell {
    pub samples: Vec<u64>,
    pub cpu_ns: u64,
    /// Connections per answering endpoint.
    pub answered: BTreeMap<Ipv4Addr, u64>,
    /// The index in the plan's targets of each sample's target.
    pub targets: Vec<u32>,
}

impl Cell {
    pub fn percentile(&self, percent: usize) -> u64 {
        let mut sorted = self.samples.clone();
        sorted.sort_unstable();
        let rank = (sorted.len() * percent).div_ceil(100).max(1);
        sorted.get(rank - 1).copied().unwrap_or(0)
    }

    /// The samples of the connections to the targets `wanted` picks (by their index in
    /// [`Plan::targets`]): one path of a plan whose targets interleave several, connection
    /// by connection. CPU time and answers are not split: the part has none.
    pub fn part(&self, wanted: impl Fn(u32) -> bool) -> Self {
        let (samples, targets) = self
            .samples
            .iter()
            .zip(&self.targets)
            .filter(|(_, target)| wanted(**target))
            .unzip();
        Self {
            samples,
            targets,
            ..Self::default()
        }
    }

    /// A batch's connections added to the cell.
    fn add(&mut self, batch: BatchResult) {
        self.samples.extend(batch.ns);
        self.targets.extend(batch.targets);
        self.cpu_ns += batch.cpu_ns;
        for reply in batch.replies {
            *self.answered.entry(reply).or_default() += 1;
        }
    }

    pub fn cpu_per_connection_ns(&self) -> f64 {
        self.cpu_ns as f64 / self.samples.len().max(1) as f64
    }
}

/// What one cell connects to, from where, and who may answer.
pub struct Plan<'a, K> {
    pub key: K,
    pub place: &'a Place,
    /// Round-robin over these.
    pub targets: Vec<SocketAddrV4>,
    /// The endpoints behind the targets: only they may answer, and every one of them must.
    pub endpoints: Vec<Ipv4Addr>,
}

/// When [`rounds`] calls its observer: around each timed batch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    Before,
    After,
}

/// Times `batch` connections per plan and round, in `rounds` rounds after one untimed
/// warm-up batch per plan (page faults, cold caches, neighbour and route lookups), the
/// plans in a new order every round: a seeded shuffle (every run draws the same orders),
/// so that no cell always follows the same other cell (a batch pays for what the one before
/// it left in the caches, by up to 3%). Then checks every answer: every connection reached
/// one of `servers`, and a cell's only its own endpoints, every one of them.
pub fn rounds<K: Copy + Ord + Debug>(
    client: &mut Client,
    servers: &[&Servers],
    plans: &[Plan<'_, K>],
    batch: u32,
    rounds: u32,
    mut observe: impl FnMut(K, Moment),
) -> anyhow::Result<BTreeMap<K, Cell>> {
    let accepted = || {
        servers
            .iter()
            .map(|servers| servers.accepted())
            .sum::<u64>()
    };
    let accepted_before = accepted();
    let mut made = 0u64;
    for plan in plans {
        client.batch(batch, plan.place, &plan.targets)?;
        made += u64::from(batch);
    }
    let mut results: BTreeMap<K, Cell> = BTreeMap::new();
    let mut rng = fastrand::Rng::with_seed(0x50c1b);
    let mut order: Vec<usize> = (0..plans.len()).collect();
    for _ in 0..rounds {
        rng.shuffle(&mut order);
        for &index in &order {
            let plan = &plans[index];
            observe(plan.key, Moment::Before);
            let result = client.batch(batch, plan.place, &plan.targets)?;
            observe(plan.key, Moment::After);
            made += u64::from(batch);
            results.entry(plan.key).or_default().add(result);
        }
    }
    check_answers(servers, accepted_before, made, plans, &results)?;
    Ok(results)
}

/// [`rounds`] with the plans alternating connection by connection instead of a batch each:
/// one client process per plan, each staying in its plan's place (`clients[i]` for
/// `plans[i]`), and per round `batch` connections per plan, one of each plan in turn, the
/// turns in a new random order every round, after a warm-up batch per plan. Every plan then
/// sees the machine as it is at that moment, where a batch paid for whatever the machine
/// did during it; and no connection follows a move of its process into another namespace
/// or cgroup.
pub fn alternating<K: Copy + Ord + Debug>(
    clients: &mut [Client],
    servers: &[&Servers],
    plans: &[Plan<'_, K>],
    batch: u32,
    rounds: u32,
) -> anyhow::Result<BTreeMap<K, Cell>> {
    ensure!(clients.len() == plans.len(), "one client per plan");
    let accepted_before = servers.iter().map(|s| s.accepted()).sum::<u64>();
    let mut made = 0u64;
    for (client, plan) in clients.iter_mut().zip(plans) {
        client.batch(batch, plan.place, &plan.targets)?;
        made += u64::from(batch);
    }
    let mut results: BTreeMap<K, Cell> = BTreeMap::new();
    let mut rng = fastrand::Rng::with_seed(0x50c1b);
    let mut order: Vec<usize> = (0..plans.len()).collect();
    for _ in 0..rounds {
        rng.shuffle(&mut order);
        for _ in 0..batch {
            for &index in &order {
                let plan = &plans[index];
                let result = clients[index].batch(1, plan.place, &plan.targets)?;
                made += 1;
                results.entry(plan.key).or_default().add(result);
            }
        }
    }
    check_answers(servers, accepted_before, made, plans, &results)?;
    Ok(results)
}

/// Waits until `servers` accepted the `made` connections since `accepted_before`, then
/// checks that every plan's connections reached its endpoints only, and all of them.
fn check_answers<K: Copy + Ord + Debug>(
    servers: &[&Servers],
    accepted_before: u64,
    made: u64,
    plans: &[Plan<'_, K>],
    results: &BTreeMap<K, Cell>,
) -> anyhow::Result<()> {
    let accepted = || {
        servers
            .iter()
            .map(|servers| servers.accepted())
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while accepted() < accepted_before + made {
        ensure!(
            Instant::now() < deadline,
            "the servers accepted {} connections, the clients made {made}",
            accepted() - accepted_before
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for plan in plans {
        let Some(cell) = results.get(&plan.key) else {
            continue;
        };
        let answered: Vec<&Ipv4Addr> = cell.answered.keys().collect();
        let expected: Vec<&Ipv4Addr> = plan.endpoints.iter().collect();
        ensure!(
            answered.iter().all(|address| expected.contains(address)),
            "{:?} was answered by {answered:?}, not only by its endpoints {expected:?}",
            plan.key
        );
        ensure!(
            answered.len() == expected.len() || cell.samples.len() < 100,
            "{:?} reached only {} of its {} endpoints",
            plan.key,
            answered.len(),
            expected.len()
        );
    }
    Ok(())
}

/// What one iperf3 run measured.
pub struct Stream {
    /// Received, in Gbit/s.
    pub gbits: f64,
    /// The sender's CPU use (iperf3's host_total), in percent.
    pub sender_cpu: f64,
}

/// `rounds` rounds of one iperf3 stream per key (`stream(key)`), the keys' order rotated by
/// one every round.
pub fn iperf3_rounds<K: Copy + Ord>(
    keys: &[K],
    rounds: u32,
    mut stream: impl FnMut(K) -> anyhow::Result<Stream>,
) -> anyhow::Result<BTreeMap<K, Vec<Stream>>> {
    let mut throughput: BTreeMap<K, Vec<Stream>> = BTreeMap::new();
    for round in 0..rounds as usize {
        for offset in 0..keys.len() {
            let key = keys[(offset + round) % keys.len()];
            throughput.entry(key).or_default().push(stream(key)?);
        }
    }
    Ok(throughput)
}

/// One iperf3 stream of `seconds` to `target`, from `netns` (and `cgroup`).
pub fn iperf3(
    netns: &File,
    cgroup: Option<&Path>,
    target: SocketAddrV4,
    seconds: u32,
) -> anyhow::Result<Stream> {
    let mut last_error = String::new();
    for _ in 0..2 {
        let mut command = in_netns(netns, "iperf3");
        if let Some(cgroup) = cgroup {
            let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .context("a cgroup path without NUL")?;
            // SAFETY: only async-signal-safe calls (open, write, close) before exec.
            unsafe {
                command.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd >= 0 {
                        libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                    }
                    Ok(())
                });
            }
        }
        let output = command
            .args([
                "-c",
                &target.ip().to_string(),
                "-p",
                &target.port().to_string(),
                "-t",
                &seconds.to_string(),
                "-J",
            ])
            .output()
            .context("run iperf3: install it (`cargo xtask setup` does)")?;
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
        if let Some(bits) = report["end"]["sum_received"]["bits_per_second"].as_f64() {
            return Ok(Stream {
                gbits: bits / 1e9,
                sender_cpu: report["end"]["cpu_utilization_percent"]["host_total"]
                    .as_f64()
                    .unwrap_or(0.0),
            });
        }
        last_error = format!(
            "{} {}",
            report["error"],
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("iperf3 -c {target} failed: {last_error}")
}
