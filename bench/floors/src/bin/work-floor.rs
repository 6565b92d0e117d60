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
//!     work-floor postgres URL MIGRATIONS_DIR JOBS CONNECTIONS BATCH  the same on PostgreSQL
//!                                               (URL: an empty database, given the receiver's
//!                                               schema): CONNECTIONS connections, each taking
//!                                               BATCH due jobs with their leases and their
//!                                               attempts' starts in one statement (one commit),
//!                                               then their ends in another. 1 BATCH is the
//!                                               floor, batched as SQLite's; BATCH 1 is the
//!                                               receiver's own shape there, a commit per change
//!     work-floor postgres-server-cpu            the PostgreSQL server's CPU so far, in µs
//!
//! Prints one JSON line: this process's CPU (user + system, every thread, not its children's)
//! per job over the jobs alone, and jobs per second; on PostgreSQL also the server's CPU per job
//! over the same span (every `postgres` process on this machine: a quiet server of its own).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use rusqlite::{params, Connection};
use sume_floors::{cpu_us, now_ms, open_ledger, postgres_server_cpu_us, Error};

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: work-floor http URL CONCURRENCY JOBS | spawn CONCURRENCY JOBS PROGRAM... \
                 | sqlite DB MIGRATIONS_DIR JOBS BATCH \
                 | postgres URL MIGRATIONS_DIR JOBS CONNECTIONS BATCH | postgres-server-cpu";
    if args == ["postgres-server-cpu"] {
        println!("{:.0}", postgres_server_cpu_us()?);
        return Ok(());
    }
    let on_postgres = args.first().is_some_and(|mode| mode == "postgres");
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
        [mode, url, migrations, jobs, connections, batch] if mode == "postgres" => {
            let (jobs, connections, batch): (usize, usize, i64) =
                (jobs.parse()?, connections.parse()?, batch.parse()?);
            postgres_claim(url, migrations, jobs)?;
            // Connected before the measure, as the receiver's pool is: a new session costs the
            // server about 9 ms of CPU.
            let clients = (0..connections.max(1))
                .map(|_| postgres::Client::connect(url, postgres::NoTls))
                .collect::<Result<Vec<_>, _>>()?;
            (
                jobs,
                Box::new(move || postgres_run_jobs(clients, batch.max(1))),
            )
        }
        _ => return Err(usage.into()),
    };
    let server_cpu = || {
        if on_postgres {
            postgres_server_cpu_us()
        } else {
            Ok(0.0)
        }
    };
    let (cpu_before, server_before, started) = (cpu_us()?, server_cpu()?, Instant::now());
    measure()?;
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu, server) = (cpu_us()? - cpu_before, server_cpu()? - server_before);
    println!(
        "{{\"jobs\":{jobs},\"cpu_us_per_job\":{:.2},\"server_cpu_us_per_job\":{:.2},\
         \"jobs_per_second\":{:.0}}}",
        cpu / jobs as f64,
        server / jobs as f64,
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

/// The receiver's PostgreSQL schema (every `*.sql` of `migrations`, in name order), then JOBS
/// claimed jobs with their work on the default route, as the claims would leave them.
fn postgres_claim(url: &str, migrations: &str, jobs: usize) -> Result<(), Error> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    for file in sume_floors::migration_files(migrations)? {
        client.batch_execute(&std::fs::read_to_string(file)?)?;
    }
    let job_ids: Vec<String> = (0..jobs).map(|n| format!("{n:016x}-work-floor")).collect();
    let bodies: Vec<String> = (0..jobs).map(body).collect();
    let mut tx = client.transaction()?;
    tx.execute(
        "INSERT INTO jobs (job_id, state, source, event_type, body, received_at, next_attempt_at,
                           updated_at, routed)
         SELECT job_id, 'claimed', 'webhook', 'job.completed', body, $3, $3, $3, true
         FROM unnest($1::text[], $2::text[]) AS claim (job_id, body)",
        &[&job_ids, &bodies, &now_ms()],
    )?;
    tx.execute(
        "INSERT INTO job_routes (job_id, route, state, next_attempt_at, updated_at)
         SELECT job_id, 'default', 'claimed', $2, $2 FROM unnest($1::text[]) AS claim (job_id)",
        &[&job_ids, &now_ms()],
    )?;
    tx.commit()?;
    client.batch_execute("VACUUM ANALYZE")?;
    Ok(())
}

/// Each job run in two statements, each its own commit: taken due (its body read), leased and
/// its attempt's start recorded, BATCH jobs at once; then their ends and their work done.
/// Each of `clients` on a thread of its own, going on until none is due.
fn postgres_run_jobs(clients: Vec<postgres::Client>, batch: i64) -> Result<(), Error> {
    const START: &str = "WITH due AS (
            SELECT job_id, route FROM job_routes
            WHERE route = 'default' AND state IN ('claimed', 'retrying') AND next_attempt_at <= $1
            ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED),
        started AS (
            UPDATE job_routes AS r SET state = 'running', attempts = r.attempts + 1,
                lease_expires_at = $2, next_attempt_at = NULL, updated_at = $1
            FROM due WHERE r.job_id = due.job_id AND r.route = due.route
            RETURNING r.job_id, r.attempts),
        recorded AS (
            INSERT INTO job_attempts (job_id, route, number, cause, started_at)
            SELECT job_id, 'default', attempts, 'first', $1 FROM started RETURNING id, job_id)
        SELECT started.job_id, started.attempts, recorded.id, jobs.body
        FROM started JOIN recorded USING (job_id) JOIN jobs USING (job_id)";
    const END: &str = "WITH ended AS (
            SELECT * FROM unnest($1::text[], $2::integer[], $3::bigint[])
                AS ended (job_id, number, attempt)),
        finished AS (
            UPDATE job_routes AS r SET state = 'done', finished_at = $4, lease_expires_at = NULL,
                updated_at = $4, next_attempt_cause = 'backoff'
            FROM ended WHERE r.job_id = ended.job_id AND r.route = 'default'
              AND r.attempts = ended.number AND r.state = 'running'
            RETURNING r.job_id),
        recorded AS (
            UPDATE job_attempts AS a SET ended_at = $4, outcome = 'done'
            FROM ended WHERE a.id = ended.attempt
              AND ended.job_id IN (SELECT job_id FROM finished))
        SELECT count(*) FROM finished";
    std::thread::scope(|scope| {
        let connections: Vec<_> = clients
            .into_iter()
            .map(|mut client| {
                scope.spawn(move || -> Result<(), Error> {
                    let (start, end) = (client.prepare(START)?, client.prepare(END)?);
                    loop {
                        let now = now_ms();
                        let rows = client.query(&start, &[&now, &(now + 60_000), &batch])?;
                        if rows.is_empty() {
                            return Ok(());
                        }
                        let (mut job_ids, mut numbers, mut attempts) = (vec![], vec![], vec![]);
                        for row in &rows {
                            job_ids.push(row.get::<_, String>(0));
                            numbers.push(row.get::<_, i32>(1));
                            attempts.push(row.get::<_, i64>(2));
                            // The body is read as a run reads it, to hand it to the handler.
                            let _body: String = row.get(3);
                        }
                        let ended: i64 = client
                            .query_one(&end, &[&job_ids, &numbers, &attempts, &now_ms()])?
                            .get(0);
                        if ended != rows.len() as i64 {
                            return Err(format!("{} runs ended, of {}", ended, rows.len()).into());
                        }
                    }
                })
            })
            .collect();
        connections
            .into_iter()
            .try_for_each(|connection| connection.join().expect("no panic"))
    })
}
