//! The storage floor: claims on the receiver's schema by a bare SQLite loop, nothing else.
//!
//!     sqlite-floor DB MIGRATIONS_DIR CLAIMS DUP_RATIO
//!
//! Makes DB from the receiver's migrations (every `*.sql` of MIGRATIONS_DIR, in name order),
//! in WAL mode with `synchronous = FULL`, then claims CLAIMS jobs of ~700 B bodies in
//! transactions of 64 with the receiver's claim statement (`INSERT ... ON CONFLICT (job_id) DO
//! NOTHING`) and, for a new job, its work on one route (`job_routes`, keyed by the job's
//! number). DUP_RATIO of them repeat an earlier job_id; at 1, every claim repeats one of a
//! set claimed before the measure starts. Prints one JSON line: the process's CPU (user +
//! system) per claim over the claims alone, and claims per second.

use std::time::Instant;

use rusqlite::{params, Connection};
use sume_floors::{cpu_us, now_ms, open_ledger, Error};

const BATCH: usize = 64;
/// The job_ids the duplicates-only case repeats, claimed before its measure.
const DUPLICATE_SET: usize = 10_000;
/// The receiver's claim (src/ledger/sqlite/jobs.rs, `CLAIM_SQL`).
const CLAIM: &str = "INSERT OR FAIL INTO jobs (job_id, state, source, event_type, body,
                                          received_at, next_attempt_at, updated_at)
     VALUES (?1, 'claimed', 'webhook', 'job.completed', ?2, ?3, ?3, ?3)
     ON CONFLICT (job_id) DO NOTHING";
/// A new job's work on its one route (`CLAIM_ROUTE_SQL`).
const CLAIM_ROUTE: &str = "INSERT OR IGNORE INTO job_routes
         (job, route, state, next_attempt_at, updated_at)
     VALUES (?1, 'default', 'claimed', ?2, ?2)";

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [db, migrations, claims, dup_ratio] = args.as_slice() else {
        return Err("usage: sqlite-floor DB MIGRATIONS_DIR CLAIMS DUP_RATIO".into());
    };
    let claims: usize = claims.parse()?;
    let dup_ratio: f64 = dup_ratio.parse()?;
    if !(0.0..=1.0).contains(&dup_ratio) {
        return Err(format!("DUP_RATIO {dup_ratio}: between 0 and 1").into());
    }
    let mut conn = open_ledger(db, migrations)?;
    let mut random = XorShift(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()));
    let ids = if dup_ratio >= 1.0 {
        let set: Vec<String> = (0..DUPLICATE_SET).map(|_| job_id(&mut random)).collect();
        claim_all(&mut conn, &set)?;
        (0..claims)
            .map(|_| set[random.below(set.len())].clone())
            .collect()
    } else {
        let mut ids: Vec<String> = Vec::with_capacity(claims);
        for _ in 0..claims {
            let repeat = !ids.is_empty() && random.unit() < dup_ratio;
            let id = if repeat {
                ids[random.below(ids.len())].clone()
            } else {
                job_id(&mut random)
            };
            ids.push(id);
        }
        ids
    };
    let (cpu_before, started) = (cpu_us()?, Instant::now());
    claim_all(&mut conn, &ids)?;
    let (cpu, elapsed) = (cpu_us()? - cpu_before, started.elapsed().as_secs_f64());
    println!(
        "{{\"claims\":{claims},\"cpu_us_per_claim\":{:.2},\"claims_per_second\":{:.0}}}",
        cpu / claims as f64,
        claims as f64 / elapsed
    );
    Ok(())
}

fn claim_all(conn: &mut Connection, ids: &[String]) -> Result<(), Error> {
    conn.execute_batch("PRAGMA synchronous = FULL")?;
    let mut body = String::with_capacity(1024);
    for batch in ids.chunks(BATCH) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            let mut claim = tx.prepare_cached(CLAIM)?;
            let mut route = tx.prepare_cached(CLAIM_ROUTE)?;
            let now = now_ms();
            for id in batch {
                body.clear();
                body.push_str("{\"job_id\":\"");
                body.push_str(id);
                body.push_str("\",\"type\":\"job.completed\",\"result\":{\"pad\":\"");
                body.extend(std::iter::repeat_n('x', 560));
                body.push_str("\"}}");
                if claim.execute(params![id, body, now])? == 1 {
                    route.execute(params![tx.last_insert_rowid(), now])?;
                }
            }
        }
        tx.commit()?;
    }
    Ok(())
}

fn job_id(random: &mut XorShift) -> String {
    format!("{:016x}-floor", random.next())
}

/// A small deterministic generator: the ids and which claims repeat need no crate.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
