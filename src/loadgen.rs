//! The load generator: signed deliveries over keep-alive connections, then a ledger check.
//!
//! `sume-receiver loadgen` sends deliveries the way Sume does (fresh timestamp and signature per
//! request; a duplicate re-sends an earlier job_id, as a Redeliver does), reports throughput,
//! latency percentiles and status counts, and then checks that the ledger holds exactly the
//! job_ids that were acknowledged.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::config::{Config, LedgerConfig, Secret};
use crate::event_type::EventType;
use crate::ingest::{SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::job_id::JobId;
use crate::ledger::{ClaimOutcome, NewClaim, PendingClaims, Source};
use crate::signature;

#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Deliveries to send (the run also stops at --duration).
    #[arg(long, short = 'n', default_value_t = 10_000)]
    pub requests: usize,
    /// Stop after this long even if --requests are not all sent ("15s").
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Share of deliveries that re-send an earlier job_id (0.0 to 1.0).
    #[arg(long, short = 'd', default_value_t = 0.3)]
    pub dup_ratio: f64,
    /// Approximate body size in bytes.
    #[arg(long, short = 'b', default_value_t = 1024)]
    pub body_bytes: usize,
    /// Tag of this run's job_ids (`<random hex>-<tag>`); reuse a tag with --existing to send
    /// duplicates of an earlier run.
    #[arg(long)]
    pub tag: Option<String>,
    /// The first K job_ids of --tag are already claimed: duplicates may pick them, new job_ids
    /// start after them.
    #[arg(long, default_value_t = 0)]
    pub existing: usize,
    /// Send at most this many requests per second in all (default: as fast as answered).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Send `GET /healthz` instead of deliveries: the HTTP stack alone, no ledger.
    #[arg(long)]
    pub healthz: bool,
    /// No receiver, no HTTP: claim straight into the config's ledger through the writer's own
    /// commit, --connections claims per transaction, back to back (each batch commits while the
    /// previous one's WAL sync runs, as the writer does while claims keep coming). The durable
    /// limit the full path is measured against; the service must be stopped.
    #[arg(long, conflicts_with_all = ["healthz", "rate", "postgres_alone"])]
    pub sqlite_alone: bool,
    /// No receiver, no HTTP: --connections tasks claim through the PostgreSQL ledger's own
    /// claim batcher (database.url), as that many connections' deliveries would. The durable
    /// limit of a receiver on PostgreSQL.
    #[arg(long, conflicts_with_all = ["healthz", "rate"])]
    pub postgres_alone: bool,
    /// More receivers on the same ledger (host:port): the connections are spread over the
    /// config's listener and these, as a load balancer would.
    #[arg(long, value_name = "ADDRESS")]
    pub also_to: Vec<std::net::SocketAddr>,
    /// Skip the ledger check (for a receiver on another machine).
    #[arg(long)]
    pub no_check: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run even though the config has a [handler]: every delivery is then a fake job that the
    /// receiver's real handler runs.
    #[arg(long)]
    pub allow_handler: bool,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tag: String,
    pub sent: usize,
    pub seconds: f64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub statuses: BTreeMap<String, usize>,
    pub acknowledged_new: usize,
    pub acknowledged_duplicate: usize,
    /// Distinct job_ids of this tag known to the receiver after the run (existing + new).
    pub unique_job_ids: usize,
    pub ledger_check: String,
    /// This process's own CPU time (user + system, all threads) and context switches per
    /// request while sending: with --sqlite-alone or --postgres-alone it is the claim path
    /// itself, the storage floor the full path is measured against.
    pub own_cpu_us_per_request: f64,
    pub own_context_switches_per_request: f64,
}

/// Shared state of the connections of one run.
struct Run {
    args: LoadgenArgs,
    config: Config,
    /// The newest live secret, as Sume signs with it.
    secret: Secret,
    tag: String,
    seed: u64,
    padding: String,
    issued: AtomicUsize,
    unique: AtomicUsize,
    deadline: Option<Instant>,
    acknowledged: Mutex<HashSet<usize>>,
}

/// Per-connection tallies, merged at the end.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    statuses: BTreeMap<String, usize>,
    new: usize,
    duplicate: usize,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        for (status, count) in other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
        self.new += other.new;
        self.duplicate += other.duplicate;
    }

    /// One delivery's answer: its status, its time, and whether it was a first claim.
    fn record(&mut self, status: &str, elapsed: Duration, duplicate: Option<bool>) {
        self.latencies_us
            .push(elapsed.as_micros().min(u32::MAX as u128) as u32);
        *self.statuses.entry(status.to_owned()).or_default() += 1;
        match duplicate {
            Some(true) => self.duplicate += 1,
            Some(false) => self.new += 1,
            None => {}
        }
    }
}

pub async fn run(args: LoadgenArgs, config: Config) -> anyhow::Result<Report> {
    // It signs with the configured secrets: pointed at a production config, its deliveries are
    // genuine to the receiver and its handler would run thousands of fake jobs.
    if config.handler.is_some() && !args.allow_handler && !args.healthz {
        bail!(
            "this config has a [handler]: the load generator's fake jobs would run it. Use a \
             benchmark config without [handler], or pass --allow-handler if that is what you want"
        );
    }
    if !(0.0..=1.0).contains(&args.dup_ratio) {
        bail!("--dup-ratio must be between 0 and 1");
    }
    if args.connections == 0 {
        bail!("--connections must be at least 1");
    }
    if args
        .rate
        .is_some_and(|rate| !(rate > 0.0 && rate.is_finite()))
    {
        bail!("--rate must be a positive number of requests per second");
    }
    if args.dup_ratio >= 1.0 && args.existing == 0 {
        bail!("--dup-ratio 1 needs --existing: there is nothing to duplicate");
    }
    let tag = args
        .tag
        .clone()
        .unwrap_or_else(|| format!("lg{:x}", fastrand::u32(..)));
    let run = Arc::new(Run {
        seed: seed_of(&tag),
        padding: "x".repeat(args.body_bytes.saturating_sub(110)),
        issued: AtomicUsize::new(0),
        unique: AtomicUsize::new(args.existing),
        deadline: args.duration.map(|d| Instant::now() + d),
        acknowledged: Mutex::new(HashSet::new()),
        tag,
        secret: config.signing_secrets()?.remove(0),
        config,
        args,
    });
    let started = Instant::now();
    let usage_before = own_usage();
    let mut total = Tally::default();
    if run.args.sqlite_alone {
        let run = run.clone();
        total = tokio::task::spawn_blocking(move || run.claim_without_service()).await??;
    } else if run.args.postgres_alone {
        total = run.clone().claim_through_postgres().await?;
    } else {
        let receivers: Vec<std::net::SocketAddr> = std::iter::once(run.config.server.listen)
            .chain(run.args.also_to.iter().copied())
            .collect();
        let mut connections = tokio::task::JoinSet::new();
        for index in 0..run.args.connections {
            let address = receivers[index % receivers.len()];
            connections.spawn(run.clone().connection(address));
        }
        while let Some(tally) = connections.join_next().await {
            total.merge(tally??);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let usage = own_usage().since(usage_before);
    total.latencies_us.sort_unstable();
    let percentile = |p: f64| -> f64 {
        let sorted = &total.latencies_us;
        if sorted.is_empty() {
            return 0.0;
        }
        let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
        f64::from(sorted[index]) / 1000.0
    };
    let sent = total.latencies_us.len();
    let unique_job_ids = run.unique.load(Ordering::Relaxed);
    let ledger_check = if run.args.healthz || run.args.no_check {
        "skipped".to_owned()
    } else {
        // Off the runtime: a PostgreSQL ledger is read through a blocking client of its own.
        let run = run.clone();
        check_ledger(&run).await?
    };
    Ok(Report {
        tag: run.tag.clone(),
        sent,
        seconds,
        per_second: sent as f64 / seconds,
        p50_ms: percentile(0.50),
        p90_ms: percentile(0.90),
        p99_ms: percentile(0.99),
        max_ms: percentile(1.0),
        statuses: total.statuses,
        acknowledged_new: total.new,
        acknowledged_duplicate: total.duplicate,
        unique_job_ids,
        ledger_check,
        own_cpu_us_per_request: usage.cpu_us / sent.max(1) as f64,
        own_context_switches_per_request: usage.context_switches / sent.max(1) as f64,
    })
}

/// CPU time and context switches of this process so far (getrusage).
#[derive(Clone, Copy)]
struct Usage {
    cpu_us: f64,
    context_switches: f64,
}

impl Usage {
    fn since(self, earlier: Usage) -> Usage {
        Usage {
            cpu_us: self.cpu_us - earlier.cpu_us,
            context_switches: self.context_switches - earlier.context_switches,
        }
    }
}

fn own_usage() -> Usage {
    // SAFETY: getrusage only writes the struct we pass; zeroed is a valid rusage.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Usage {
        cpu_us: micros(usage.ru_utime) + micros(usage.ru_stime),
        context_switches: (usage.ru_nvcsw + usage.ru_nivcsw) as f64,
    }
}

fn seed_of(tag: &str) -> u64 {
    tag.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A well-mixed 64-bit hash, so job_ids land all over the ledger's index like real ones.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Run {
    fn job_id(&self, index: usize) -> String {
        format!("{:016x}-{}", splitmix64(self.seed ^ index as u64), self.tag)
    }

    /// Takes the next request of the run; `false` when the run is over.
    fn take_turn(&self) -> bool {
        self.issued.fetch_add(1, Ordering::Relaxed) < self.args.requests
            && self
                .deadline
                .is_none_or(|deadline| Instant::now() < deadline)
    }

    /// The job index of the next delivery, or `None` when the run is over.
    fn next_delivery(&self) -> Option<usize> {
        if !self.take_turn() {
            return None;
        }
        let known = self.unique.load(Ordering::Relaxed);
        if known > 0 && fastrand::f64() < self.args.dup_ratio {
            Some(fastrand::usize(..known))
        } else {
            Some(self.unique.fetch_add(1, Ordering::Relaxed))
        }
    }

    fn body(&self, index: usize) -> String {
        format!(
            r#"{{"job_id":"{}","type":"job.completed","status":"completed","result":{{"pad":"{}"}}}}"#,
            self.job_id(index),
            self.padding
        )
    }

    /// The `--sqlite-alone` run: batches of --connections claims, back to back as the writer
    /// thread commits them while claims keep coming: each batch commits while the previous
    /// one's WAL sync runs. A claim's latency: from its batch's start to its answer.
    fn claim_without_service(&self) -> anyhow::Result<Tally> {
        let LedgerConfig::Sqlite(sqlite) = &self.config.database else {
            bail!("--sqlite-alone measures a SQLite ledger; this config names a PostgreSQL one (--postgres-alone)");
        };
        let _lock = crate::instance_lock::InstanceLock::acquire(&sqlite.path)?;
        let writer = crate::ledger::WriterAlone::open(sqlite)?;
        let mut tally = Tally::default();
        let mut previous: Option<(Vec<usize>, Instant, PendingClaims)> = None;
        loop {
            let batch: Vec<usize> = std::iter::from_fn(|| self.next_delivery())
                .take(self.args.connections)
                .collect();
            let current = (!batch.is_empty()).then(|| {
                let claims = batch.iter().map(|&index| self.claim(index)).collect();
                let started = Instant::now();
                (batch, started, writer.claim(claims))
            });
            if let Some((batch, started, pending)) = previous.take() {
                let outcomes = pending.wait().context("a batch of claims failed")?;
                let elapsed = started.elapsed();
                let mut acknowledged = self.acknowledged.lock().expect("not poisoned");
                for (index, outcome) in batch.into_iter().zip(outcomes) {
                    tally.record("claimed", elapsed, Some(outcome == ClaimOutcome::Duplicate));
                    acknowledged.insert(index);
                }
            }
            previous = current;
            if previous.is_none() {
                return Ok(tally);
            }
        }
    }

    /// The `--postgres-alone` run: --connections tasks, each claiming one delivery at a time
    /// through the ledger (its batcher groups them), each claim's latency its own wait.
    async fn claim_through_postgres(self: Arc<Self>) -> anyhow::Result<Tally> {
        if self.config.database.sqlite_path().is_some() {
            bail!("--postgres-alone needs database.url in the config");
        }
        let ledger = crate::ledger::Ledger::open(&self.config.database).await?;
        let mut claimers = tokio::task::JoinSet::new();
        for _ in 0..self.args.connections {
            let (run, ledger) = (self.clone(), ledger.clone());
            claimers.spawn(async move {
                let mut tally = Tally::default();
                while let Some(index) = run.next_delivery() {
                    let started = Instant::now();
                    let outcome = ledger.claim(run.claim(index)).await?;
                    tally.record(
                        "claimed",
                        started.elapsed(),
                        Some(outcome == ClaimOutcome::Duplicate),
                    );
                    run.acknowledged.lock().expect("not poisoned").insert(index);
                }
                anyhow::Ok(tally)
            });
        }
        let mut total = Tally::default();
        while let Some(tally) = claimers.join_next().await {
            total.merge(tally??);
        }
        ledger.close().await;
        Ok(total)
    }

    /// Delivery `index` as the receiver would claim it.
    fn claim(&self, index: usize) -> NewClaim {
        NewClaim {
            job_id: JobId::parse(&self.job_id(index)).expect("generated ids are valid"),
            event_type: Some(EventType::parse("job.completed").expect("a valid type")),
            body: self.body(index).into(),
            source: Source::Webhook,
            trace_context: None,
            routing: crate::ledger::Routing::default_route(),
        }
    }

    fn request(&self, index: Option<usize>) -> anyhow::Result<Request<Full<Bytes>>> {
        let server = &self.config.server;
        let host = server.listen.to_string();
        let Some(index) = index else {
            return Ok(Request::get("/healthz")
                .header("host", host)
                .body(Full::default())?);
        };
        let body = self.body(index);
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)?
            .as_secs()
            .to_string();
        let signature = signature::sign(
            std::slice::from_ref(&self.secret),
            &timestamp,
            body.as_bytes(),
        );
        Ok(Request::builder()
            .method(Method::POST)
            .uri(server.webhook_path.as_str())
            .header("host", host)
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, timestamp)
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(Bytes::from(body)))?)
    }

    async fn connection(self: Arc<Self>, address: std::net::SocketAddr) -> anyhow::Result<Tally> {
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .with_context(|| format!("cannot connect to {address}"))?;
        stream.set_nodelay(true)?;
        let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut tally = Tally::default();
        // With --rate, each connection sends its share at a steady pace.
        let mut pace = self.args.rate.map(|rate| {
            let period = Duration::from_secs_f64(self.args.connections as f64 / rate);
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker
        });
        loop {
            if let Some(ticker) = pace.as_mut() {
                ticker.tick().await;
            }
            let index = if self.args.healthz {
                if !self.take_turn() {
                    break;
                }
                None
            } else {
                match self.next_delivery() {
                    Some(index) => Some(index),
                    None => break,
                }
            };
            let request = self.request(index)?;
            sender
                .ready()
                .await
                .context("connection closed by the receiver")?;
            let started = Instant::now();
            let response = sender
                .send_request(request)
                .await
                .context("request failed")?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            let elapsed = started.elapsed();
            let mut duplicate = None;
            if let (Some(index), true) = (index, status.is_success()) {
                let answer: serde_json::Value = serde_json::from_slice(&body)?;
                duplicate = Some(answer["duplicate"] == true);
                self.acknowledged
                    .lock()
                    .expect("not poisoned")
                    .insert(index);
            }
            tally.record(status.as_str(), elapsed, duplicate);
        }
        Ok(tally)
    }
}

/// The ledger must hold exactly the acknowledged job_ids of this run's tag: none lost, none extra.
async fn check_ledger(run: &Run) -> anyhow::Result<String> {
    let ledger = crate::ledger::Ledger::open_existing(&run.config.database).await?;
    let stored = ledger.job_ids_like(&format!("%-{}", run.tag)).await;
    ledger.close().await;
    let stored: HashSet<String> = stored?.into_iter().collect();
    let acknowledged = run.acknowledged.lock().expect("not poisoned");
    let mut expected: HashSet<String> = acknowledged.iter().map(|&i| run.job_id(i)).collect();
    expected.extend((0..run.args.existing).map(|i| run.job_id(i)));
    let lost = expected.difference(&stored).count();
    let extra = stored.difference(&expected).count();
    if lost > 0 || extra > 0 {
        bail!("ledger check FAILED: {lost} acknowledged job_ids missing, {extra} unexpected ones");
    }
    Ok(format!(
        "ok: {} job_ids, all acknowledged, none missing",
        stored.len()
    ))
}

impl Report {
    /// Prints the two-line summary; a closed stdout (`| head -1`) is not an error.
    pub fn print(&self) {
        use std::io::Write;
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(status, count)| format!("{status}: {count}"))
            .collect();
        let _ = writeln!(
            std::io::stdout().lock(),
            "tag {}: {} requests in {:.2}s = {:.0}/s; latency ms p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}\n\
             statuses {{{}}}; new {}, duplicate {}; unique job_ids {}; ledger check {}",
            self.tag,
            self.sent,
            self.seconds,
            self.per_second,
            self.p50_ms,
            self.p90_ms,
            self.p99_ms,
            self.max_ms,
            statuses.join(", "),
            self.acknowledged_new,
            self.acknowledged_duplicate,
            self.unique_job_ids,
            self.ledger_check
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_stable_per_tag_and_spread_over_the_key_space() {
        let seed = seed_of("t1");
        assert_eq!(splitmix64(seed), splitmix64(seed_of("t1")));
        assert_ne!(seed_of("t1"), seed_of("t2"));
        let leading: HashSet<u64> = (0..1000).map(|i| splitmix64(seed ^ i) >> 60).collect();
        assert_eq!(
            leading.len(),
            16,
            "sequential indexes map all over the index"
        );
    }
}
