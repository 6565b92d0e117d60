//! Dead letters grouped by what failed: the error's first line with the handler's own first
//! line (its stderr, or the HTTP answer's body), ids, numbers and hex made alike; an
//! operator's cancels are one group. Read from the dead jobs' list, a page at a time, written
//! once for both backends.

use std::collections::HashMap;

use super::{Actor, DeadGroup, Ledger, RetryError, State, StorageError};

/// The most dead jobs one grouping reads (the newest): bounds its time and memory.
pub const DEAD_READ: usize = 100_000;
/// Dead jobs read per page of the list.
const PAGE: usize = 1000;
/// A signature's length at most, in characters.
const SIGNATURE_CHARS: usize = 160;
/// The group of every job an operator cancelled, whatever the reason given.
pub const CANCELLED: &str = "cancelled by an operator";
/// Where a command handler's error ends and its stderr begins (see `handler.rs`).
const STDERR: &str = "; stderr: ";

/// The first line of `text` with any text on it, trimmed.
fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("")
}

/// Whether `word` is an id or a number rather than a word: 4 or more digits, or hex with a
/// digit in it (`7f3a9c01`); a short number (an exit status, an HTTP status) stays.
fn varies(word: &str) -> bool {
    let digits = word.bytes().filter(u8::is_ascii_digit).count();
    if digits == word.len() {
        return digits >= 4;
    }
    digits > 0 && word.len() >= 4 && word.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `line` with every id, long number and hex run as `#`.
fn normalise(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if varies(word) {
            out.push('#');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(if c.is_control() { ' ' } else { c });
        }
    }
    flush(&mut word, &mut out);
    out.chars().take(SIGNATURE_CHARS).collect()
}

/// The group a dead job's last error belongs to.
pub fn signature(error: Option<&str>) -> String {
    let error = error.unwrap_or("");
    if error.starts_with("cancelled by ") {
        return CANCELLED.to_owned();
    }
    let line = match error.split_once(STDERR) {
        Some((head, stderr)) => format!("{}: {}", first_line(head), first_line(stderr)),
        None => first_line(error).to_owned(),
    };
    if line.is_empty() {
        return "(no error recorded)".to_owned();
    }
    normalise(&line)
}

/// Dead jobs one group retry takes (the console's button, each batch of `jobs retry
/// --group`): a few hundred milliseconds of ledger work, so a group of any size never holds a
/// console slot for seconds.
pub const GROUP_RETRY_BATCH: usize = 500;

/// One batch of a dead-letter group's retry.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GroupRetry {
    pub retried: usize,
    /// Not retried: retention purged their body, or they left the group.
    pub refused: usize,
    /// Jobs of the group this batch did not reach.
    pub left: usize,
}

impl Ledger {
    /// Calls `each` with every dead job's id, finish time and signature, newest first, at
    /// most [`DEAD_READ`]; how many it read.
    async fn each_dead(
        &self,
        mut each: impl FnMut(String, Option<i64>, String),
    ) -> Result<usize, StorageError> {
        let mut after = None;
        let mut read = 0;
        while read < DEAD_READ {
            let page = self
                .list_jobs(Some(State::Dead), after.as_ref(), None, PAGE)
                .await?;
            read += page.jobs.len();
            for job in page.jobs {
                let signature = signature(job.last_error.as_deref());
                each(job.job_id, job.finished_at, signature);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(read)
    }

    /// Dead jobs grouped by [`signature`], the largest groups first, at most `limit` groups
    /// (of the newest [`DEAD_READ`] dead jobs).
    pub async fn dead_groups(&self, limit: usize) -> Result<Vec<DeadGroup>, StorageError> {
        let mut groups: HashMap<String, DeadGroup> = HashMap::new();
        self.each_dead(|job_id, finished_at, signature| {
            let group = groups
                .entry(signature.clone())
                .or_insert_with(|| DeadGroup {
                    signature,
                    jobs: 0,
                    last_finished_at: finished_at,
                    example_job_id: job_id,
                });
            group.jobs += 1;
        })
        .await?;
        let mut groups: Vec<DeadGroup> = groups.into_values().collect();
        groups.sort_by(|a, b| {
            b.jobs
                .cmp(&a.jobs)
                .then_with(|| a.signature.cmp(&b.signature))
        });
        groups.truncate(limit);
        Ok(groups)
    }

    /// The dead jobs of the group `signature` (of the newest [`DEAD_READ`]).
    pub async fn dead_group_jobs(&self, signature: &str) -> Result<Vec<String>, StorageError> {
        let mut jobs = Vec::new();
        self.each_dead(|job_id, _, of| {
            if of == signature {
                jobs.push(job_id);
            }
        })
        .await?;
        Ok(jobs)
    }

    /// Retries up to `batch` dead jobs of the group `signature`, each recorded as `actor`'s
    /// retry: a batch at a time, so no request holds the ledger (or the console) for long.
    /// What happened: how many were retried, how many could not be (retention purged their
    /// body, or they are no longer dead), and how many of the group were left for the next
    /// batch.
    pub async fn retry_dead_group(
        &self,
        signature: &str,
        actor: &Actor,
        now: i64,
        batch: usize,
    ) -> Result<GroupRetry, StorageError> {
        let jobs = self.dead_group_jobs(signature).await?;
        let mut done = GroupRetry {
            left: jobs.len().saturating_sub(batch),
            ..GroupRetry::default()
        };
        for stored in jobs.into_iter().take(batch) {
            // A stored id that cannot run is refused, as it would only be given up again.
            let Ok(job_id) = crate::job_id::JobId::parse(&stored) else {
                done.refused += 1;
                continue;
            };
            match self.retry_job(&job_id, None, actor, now).await {
                Ok(()) => done.retried += 1,
                Err(RetryError::Storage(error)) => return Err(error),
                Err(_) => done.refused += 1,
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handlers_stderr_is_part_of_its_signature_with_ids_and_numbers_made_alike() {
        let one = "exited with status 1; stderr: downstream unavailable: 503 from billing-api \
                   (request 7f3a9c01e2, order 48213)\nTraceback...";
        let two = "exited with status 1; stderr: downstream unavailable: 503 from billing-api \
                   (request 0b12ffee99, order 1177)";
        assert_eq!(
            signature(Some(one)),
            "exited with status 1: downstream unavailable: 503 from billing-api (request #, order #)"
        );
        assert_eq!(signature(Some(one)), signature(Some(two)));
        let other = "exited with status 1; stderr: invalid payload: field \"amount\" missing";
        assert_ne!(signature(Some(one)), signature(Some(other)));
    }

    #[test]
    fn an_http_answer_is_grouped_by_its_status_and_first_line() {
        let error = "handler answered 422 Unprocessable Entity: unknown customer 88120\nmore";
        assert_eq!(
            signature(Some(error)),
            "handler answered 422 Unprocessable Entity: unknown customer #"
        );
        assert_ne!(
            signature(Some(error)),
            signature(Some(
                "handler answered 503 Service Unavailable: unknown customer 1"
            ))
        );
    }

    #[test]
    fn every_cancel_is_one_group_and_words_stay_words() {
        assert_eq!(
            signature(Some("cancelled by console:alice: duplicate order")),
            CANCELLED
        );
        assert_eq!(signature(Some("cancelled by cli:bob: test job")), CANCELLED);
        assert_eq!(signature(None), "(no error recorded)");
        // Hex letters alone are a word ("dead", "beef"); a uuid's parts are not.
        assert_eq!(
            signature(Some("dead beef 123e4567-e89b-12d3-a456-426614174000")),
            "dead beef #-#-#-#-#"
        );
    }
}
