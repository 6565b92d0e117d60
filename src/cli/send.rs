//! `sign` and `send-test`: deliveries signed by hand with the configured secret, to check a
//! receiver end to end (from this machine, or with curl from another one).

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;

use sume_receiver::config::Config;
use sume_receiver::ingest::{SIGNATURE_HEADER, TIMESTAMP_HEADER};
use sume_receiver::job_id::JobId;
use sume_receiver::signature;

/// How long `send-test` waits for the answer: Sume's own timeout.
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, clap::Args)]
pub struct SignArgs {
    /// The body to sign: a file, or `-` for standard input.
    #[arg(long, default_value = "-")]
    pub body: PathBuf,
    /// The timestamp to sign with, in Unix seconds (default: now).
    #[arg(long)]
    pub timestamp: Option<u64>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SendTestArgs {
    /// The job_id of the test delivery (default: a new `send-test-...` id). The delivery is a
    /// real job: the handler runs it.
    #[arg(long)]
    pub job_id: Option<JobId>,
    /// Where to send it (default: the configured listener and webhook path, https:// with
    /// `[server.tls]`: the listen address must then be a name the certificate covers, or
    /// give the URL with one).
    #[arg(long)]
    pub url: Option<String>,
    /// CA certificates (PEM) to trust for an https URL besides the system's (a private CA's).
    #[arg(long, value_name = "PATH")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// Prints the two headers Sume would send with this body, and a ready `curl` line.
pub fn sign(args: &SignArgs, config: &Config) -> anyhow::Result<()> {
    let (body, data) = if args.body.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::stdin()
            .read_to_end(&mut body)
            .context("cannot read the body from standard input")?;
        let text = String::from_utf8(body.clone()).context(
            "a body on standard input must be UTF-8 (pass binary bodies with --body FILE)",
        )?;
        (body, shell_quote(&text))
    } else {
        let body = std::fs::read(&args.body)
            .with_context(|| format!("cannot read {}", args.body.display()))?;
        (body, shell_quote(&format!("@{}", args.body.display())))
    };
    let timestamp = args.timestamp.unwrap_or_else(unix_now).to_string();
    let signature = newest_signature(config, &timestamp, &body)?;
    let timestamp_header = format!("{TIMESTAMP_HEADER}: {timestamp}");
    let signature_header = format!("{SIGNATURE_HEADER}: {signature}");
    println!("{timestamp_header}\n{signature_header}");
    println!(
        "curl -sS -X POST {} -H {} -H {} -H 'content-type: application/json' --data-binary {data}",
        shell_quote(&default_url(config)),
        shell_quote(&timestamp_header),
        shell_quote(&signature_header),
    );
    Ok(())
}

/// Signs a test delivery and sends it; prints the status, the answer and the latency. An answer
/// other than 2xx is an error.
pub async fn send_test(args: &SendTestArgs, config: &Config) -> anyhow::Result<()> {
    let job_id = match &args.job_id {
        Some(job_id) => job_id.clone(),
        None => JobId::parse(&format!("send-test-{:08x}", fastrand::u32(..)))?,
    };
    let body = serde_json::json!({
        "job_id": job_id,
        "type": "job.completed",
        "status": "completed",
        "test": true,
    })
    .to_string();
    let timestamp = unix_now().to_string();
    let signature = newest_signature(config, &timestamp, body.as_bytes())?;
    let url = args.url.clone().unwrap_or_else(|| default_url(config));
    let request = hyper::Request::post(url.as_str())
        .header(TIMESTAMP_HEADER, &timestamp)
        .header(SIGNATURE_HEADER, signature)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .with_context(|| format!("invalid --url {url:?}"))?;
    let started = Instant::now();
    let client = sume_receiver::http_client::client_trusting(args.ca_file.as_deref())?;
    let answer = sume_receiver::http_client::send(&client, request, DEADLINE, 64 * 1024)
        .await
        .map_err(anyhow::Error::new)
        .with_context(|| format!("cannot deliver to {url}"))?;
    let elapsed = started.elapsed();
    println!(
        "{} in {:.1} ms from {url}: {}",
        answer.status,
        elapsed.as_secs_f64() * 1000.0,
        String::from_utf8_lossy(&answer.body).trim()
    );
    if !answer.status.is_success() {
        bail!("the receiver did not acknowledge the test delivery of {job_id}");
    }
    Ok(())
}

/// Sume signs with every live secret; a receiver needs only one to match. The newest (first)
/// is the one a rotation is heading to.
fn newest_signature(config: &Config, timestamp: &str, body: &[u8]) -> anyhow::Result<String> {
    let secrets = config.signing_secrets()?;
    Ok(signature::sign(&secrets[..1], timestamp, body))
}

/// The configured listener's webhook URL; a wildcard address is reached on loopback.
fn default_url(config: &Config) -> String {
    let mut address = config.server.listen;
    if address.ip().is_unspecified() {
        address.set_ip(if address.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let scheme = if config.server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{address}{}", config.server.webhook_path)
}

/// `text` as one POSIX shell word.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_survive_quotes() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote(r#"{"it's":1}"#), r#"'{"it'\''s":1}'"#);
    }

    #[test]
    fn a_wildcard_listener_is_reached_on_loopback() {
        let config = |listen: &str| {
            Config::parse(
                &format!("[server]\nlisten = \"{listen}\"\n[signature]\nsecrets = [\"s\"]\n"),
                std::path::Path::new("/"),
            )
            .unwrap()
        };
        assert_eq!(
            default_url(&config("0.0.0.0:9000")),
            "http://127.0.0.1:9000/sume/webhook"
        );
        assert_eq!(
            default_url(&config("[::]:9000")),
            "http://[::1]:9000/sume/webhook"
        );
        assert_eq!(
            default_url(&config("192.0.2.10:80")),
            "http://192.0.2.10:80/sume/webhook"
        );
    }
}
