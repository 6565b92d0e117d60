//! `jobs redeliver`: asks Sume to send a job's webhook again (needs no ledger).

use anyhow::{bail, Context};
use sume_receiver::config::Config;
use sume_receiver::job_id::JobId;
use sume_receiver::logging::Escaped;

#[derive(Debug, clap::Args)]
pub struct Redeliver {
    /// The job's id, as Sume sends it (`job_id` in the delivery).
    job_id: JobId,
}

impl Redeliver {
    pub(super) async fn run(&self, config: &Config) -> anyhow::Result<()> {
        let job_id = &self.job_id;
        let api = config
            .sume_api
            .as_ref()
            .context("`jobs redeliver` needs a [sume_api] section (base_url, api_key_file)")?;
        let answer = sume_receiver::reconcile::call_sume(
            &sume_receiver::http_client::new_client(),
            api,
            &api.api_key()?,
            job_id,
            "webhook/redeliver",
            hyper::Method::POST,
        )
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| {
            format!(
                "cannot reach Sume at {}",
                sume_receiver::config::redact_url(&api.base_url)
            )
        })?;
        let text = String::from_utf8_lossy(&answer.body);
        if !answer.status.is_success() {
            bail!(
                "Sume refused the redelivery of {job_id}: {} {}",
                answer.status,
                Escaped(text.trim())
            );
        }
        println!(
            "Sume accepted the redelivery of {job_id} ({}); the webhook follows",
            answer.status
        );
        Ok(())
    }
}
