//! The work side's floors: what running a job costs at the least, apart from the receiver.
//!
//!     work-floor http URL CONCURRENCY JOBS      a bare hyper client POSTing a ~700 B body to
//!                                               URL over CONCURRENCY keep-alive connections
//!     work-floor spawn CONCURRENCY JOBS PROGRAM...  the program started by posix_spawn (the
//!                                               standard library's, no step between fork and
//!                                               exec), the body on its stdin, its stderr read,
//!                                               waited for; CONCURRENCY at once
//!     work-floor sqlite DB MIGRATIONS_DIR JOBS BATCH  a bare SQLite loop on the receiver's
//!                                               schema (WAL, synchronous = FULL): JOBS claimed
//!                                               jobs made first, then each run as the least a
//!                                               run needs: taken due with its lease and its
//!                                               attempt's start recorded, then its end; BATCH
//!                                               starts, then BATCH ends, a transaction each
//!
//! Prints one JSON line: this process's CPU (user + system, every thread, not its children's)
//! per job over the jobs alone, and jobs per second.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use rusqlite::{params, Connection};
use sume_floors::{cpu_us, now_ms, open_ledger, Error};

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: work-floor http URL CONCURRENCY JOBS | spawn CONCURRENCY JOBS PROGRAM... \
                 | sqlite DB MIGRATIONS_DIR JOBS BATCH";
    let (jobs, measure): (usize, Box<dyn FnOnce() -> Result<(), Error>>) = match args.as_slice() {
        [mode, url, concurrency, jobs] if mode == "http" => {
            let (url, concurrency, jobs) = (url.clone(), concurrency.parse()?, jobs.parse()?);
            (jobs, Box::new(move || http(&url, concurrency, jobs)))
        }
        [mode, concurrency, jobs, program @ ..] if mode == "spawn" && !program.is_empty() => {
            let (concurrency, jobs) = (concurrency.parse()?, jobs.parse()?);
            let program = program.to_vec();
            (jobs, Box::new(move || spawn(&program, concurrency, jobs)))
        }
        [mode, db, migrations, jobs, batch] if mode == "sqlite" => {
            let (jobs, batch): (usize, usize) = (jobs.parse()?, batch.parse()?);
            let mut conn = open_ledger(db, migrations)?;
            claim(&mut conn, jobs)?;
            (jobs, Box::new(move || run_jobs(&mut conn, batch.max(1))))
        }
        _ => return Err(usage.into()),
    };
    let (cpu_before, started) = (cpu_us()?, Instant::now());
    measure()?;
    let (cpu, elapsed) = (cpu_us()? - cpu_before, started.elapsed().as_secs_f64());
    println!(
        "{{\"jobs\":{jobs},\"cpu_us_per_job\":{:.2},\"jobs_per_second\":{:.0}}}",
        cpu / jobs as f64,
        jobs as f64 / elapsed
    );
    Ok(())
}

fn body(n: usize) -> String {
    format!(
        "{{\"job_id\":\"{n:016x}-work-floor\",\"type\":\"job.completed\",\"result\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(560)
    )
}

/// CONCURRENCY connections, each its own task sending one request after another.
fn http(url: &str, concurrency: usize, jobs: usize) -> Result<(), Error> {
    let uri: hyper::Uri = url.parse()?;
    let authority = uri.authority().ok_or("URL without a host")?.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut tasks = Vec::new();
        for connection in 0..concurrency {
            let (uri, authority) = (uri.clone(), authority.clone());
            let share = jobs / concurrency + usize::from(connection < jobs % concurrency);
            tasks.push(tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(authority.as_str()).await?;
                stream.set_nodelay(true)?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await?;
                tokio::spawn(conn);
                for n in 0..share {
                    let request = hyper::Request::post(uri.clone())
                        .header(hyper::header::HOST, authority.as_str())
                        .header(hyper::header::CONTENT_TYPE, "application/json")
                        .body(http_body_util::Full::new(hyper::body::Bytes::from(body(n))))?;
                    let answer = sender.send_request(request).await?;
                    if !answer.status().is_success() {
                        return Err(format!("answered {}", answer.status()).into());
                    }
                    http_body_util::BodyExt::collect(answer.into_body()).await?;
                }
                Ok::<(), Error>(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        Ok(())
    })
}

/// CONCURRENCY threads, each starting the program and waiting for it, one after another.
fn spawn(program: &[String], concurrency: usize, jobs: usize) -> Result<(), Error> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..concurrency)
            .map(|thread| {
                let share = jobs / concurrency + usize::from(thread < jobs % concurrency);
                scope.spawn(move || -> Result<(), Error> {
                    for n in 0..share {
                        let mut child = Command::new(&program[0])
                            .args(&program[1..])
                            .stdin(Stdio::piped())
                            .stdout(Stdio::null())
                            .stderr(Stdio::piped())
                            .process_group(0)
                            .spawn()?;
                        // A program that does not read its stdin closes it: not an error.
                        let _ = child
                            .stdin
                            .take()
                            .expect("piped")
                            .write_all(body(n).as_bytes());
                        let mut stderr = String::new();
                        child
                            .stderr
                            .take()
                            .expect("piped")
                            .read_to_string(&mut stderr)?;
                        if !child.wait()?.success() {
                            return Err(format!("{program:?} failed: {stderr}").into());
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|thread| thread.join().expect("no panic"))
    })
}

/// JOBS claimed jobs with their work on the default route, as the claims would leave them.
fn claim(conn: &mut Connection, jobs: usize) -> Result<(), Error> {
    let tx = conn.transaction()?;
    let now = now_ms();
    for n in 0..jobs {
        tx.execute(
            "INSERT INTO jobs (job_id, state, source, event_type, body, received_at,
                               next_attempt_at, updated_at)
             VALUES (?1, 'claimed', 'webhook', 'job.completed', ?2, ?3, ?3, ?3)",
            params![format!("{n:016x}-work-floor"), body(n), now],
        )?;
        tx.execute(
            "INSERT INTO job_routes (job, route, state, next_attempt_at, updated_at)
             VALUES (?1, 'default', 'claimed', ?2, ?2)",
            params![tx.last_insert_rowid(), now],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Each job run: taken due (its body read), leased and its attempt's start recorded in one
/// transaction of BATCH; then its end and its work done in another.
fn run_jobs(conn: &mut Connection, batch: usize) -> Result<(), Error> {
    loop {
        let now = now_ms();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut started = Vec::with_capacity(batch);
        {
            let mut due = tx.prepare_cached(
                "SELECT r.job, jobs.job_id, jobs.body FROM job_routes AS r
                 JOIN jobs ON jobs.id = r.job
                 WHERE r.route = 'default' AND r.state IN ('claimed', 'retrying')
                   AND r.next_attempt_at <= ?1
                 ORDER BY r.next_attempt_at LIMIT ?2",
            )?;
            let mut lease = tx.prepare_cached(
                "UPDATE job_routes SET state = 'running', attempts = attempts + 1,
                        lease_expires_at = ?2, next_attempt_at = NULL, updated_at = ?3
                 WHERE job = ?1 AND route = 'default' AND state IN ('claimed', 'retrying')
                 RETURNING attempts",
            )?;
            let mut record = tx.prepare_cached(
                "INSERT INTO job_attempts (job_id, number, cause, started_at, route)
                 VALUES (?1, ?2, 'first', ?3, 'default')",
            )?;
            // The body is read as a run reads it, to hand it to the handler.
            let rows: Vec<(i64, String, String)> = due
                .query_map(params![now, batch as i64], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })?
                .collect::<Result<_, _>>()?;
            for (job, job_id, _body) in rows {
                let number: i64 =
                    lease.query_row(params![job, now + 60_000, now], |row| row.get(0))?;
                record.execute(params![job_id, number, now])?;
                started.push((job, number, tx.last_insert_rowid()));
            }
        }
        tx.commit()?;
        if started.is_empty() {
            return Ok(());
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            let mut finish = tx.prepare_cached(
                "UPDATE job_routes SET state = 'done', finished_at = ?3, lease_expires_at = NULL,
                        updated_at = ?3, next_attempt_cause = 'backoff'
                 WHERE job = ?1 AND route = 'default' AND attempts = ?2 AND state = 'running'",
            )?;
            let mut end = tx.prepare_cached(
                "UPDATE job_attempts SET ended_at = ?2, outcome = 'done' WHERE id = ?1",
            )?;
            let now = now_ms();
            for (job, number, attempt) in &started {
                if finish.execute(params![job, number, now])? != 1 {
                    return Err(format!("job {job}: its run's end changed nothing").into());
                }
                end.execute(params![attempt, now])?;
            }
        }
        tx.commit()?;
    }
}
