//! Sume webhook signature verification: a pure function over the headers, the raw body and a clock.
//!
//! Sume signs `{timestamp}.{raw body}` with HMAC-SHA256 once per live secret and sends the digests
//! as a comma-separated list of `sume-v1=<hex>` entries (see `SUME.md`). A request is
//! genuine when any entry matches the digest under any secret we hold, and its timestamp is within
//! the tolerance of our clock.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The scheme prefix of the entries we understand; entries of other schemes are skipped.
const SCHEME: &str = "sume-v1=";
/// Sume sends one entry per live secret (two during a rotation); anything past this is noise
/// that would only cost us HMAC comparisons.
pub const MAX_ENTRIES: usize = 8;
/// Unix seconds fit in 12 digits for the next 30,000 years; a longer timestamp is an attack or a bug.
const MAX_TIMESTAMP_DIGITS: usize = 12;
const DIGEST_LEN: usize = 32;

/// Why a request was refused. Only logged: the client always sees one generic 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("timestamp header is not a plain integer of at most {MAX_TIMESTAMP_DIGITS} digits")]
    MalformedTimestamp,
    #[error("timestamp is outside the tolerance")]
    StaleTimestamp,
    #[error("no well-formed sume-v1 entry in the signature header")]
    NoEntries,
    #[error("no signature entry matches any configured secret")]
    Mismatch,
}

/// The headers of a delivery that passed every check possible before its body is read: the
/// timestamp is well formed and fresh, and at least one `sume-v1` entry is well formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders<'a> {
    timestamp: &'a str,
    /// The timestamp, in Unix seconds.
    sent_at: i64,
    digests: Digests,
}

/// The decoded digests of a signature header, in place: a delivery's check allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digests {
    /// The first `len` are the header's digests; the rest stay zero.
    entries: [[u8; DIGEST_LEN]; MAX_ENTRIES],
    len: usize,
}

impl Digests {
    fn as_slice(&self) -> &[[u8; DIGEST_LEN]] {
        &self.entries[..self.len]
    }
}

/// Checks the two headers against the clock. Cheap: no HMAC, no body; a request that fails here
/// is refused before its body is read. `now_unix` is the receiver's clock in Unix seconds.
pub fn check_headers<'a>(
    timestamp: &'a str,
    signature_header: &str,
    now_unix: i64,
    tolerance_secs: u64,
) -> Result<SignedHeaders<'a>, SignatureError> {
    let sent_at = parse_timestamp(timestamp)?;
    if now_unix.abs_diff(sent_at) > tolerance_secs {
        return Err(SignatureError::StaleTimestamp);
    }
    let digests = parse_entries(signature_header);
    if digests.len == 0 {
        return Err(SignatureError::NoEntries);
    }
    Ok(SignedHeaders {
        timestamp,
        sent_at,
        digests,
    })
}

impl SignedHeaders<'_> {
    /// Whether any entry is the HMAC of `{timestamp}.{body}` under any of `secrets`.
    pub fn verify<S: AsRef<[u8]>>(&self, secrets: &[S], body: &[u8]) -> Result<(), SignatureError> {
        self.verify_which(secrets, body).map(drop)
    }

    /// [`SignedHeaders::verify`], saying which secret verified it: its index in `secrets`.
    pub fn verify_which<S: AsRef<[u8]>>(
        &self,
        secrets: &[S],
        body: &[u8],
    ) -> Result<usize, SignatureError> {
        for (index, secret) in secrets.iter().enumerate() {
            let secret = secret.as_ref();
            // An empty key would make every digest forgeable; config refuses it, this is belt
            // and braces.
            if secret.is_empty() {
                continue;
            }
            let mut mac =
                HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
            mac.update(self.timestamp.as_bytes());
            mac.update(b".");
            mac.update(body);
            // verify_slice compares in constant time.
            if self
                .digests
                .as_slice()
                .iter()
                .any(|digest| mac.clone().verify_slice(digest).is_ok())
            {
                return Ok(index);
            }
        }
        Err(SignatureError::Mismatch)
    }

    /// How far the sender's clock (the timestamp) is behind `now_unix`, in seconds (negative:
    /// ahead). Within the tolerance, by construction.
    pub fn skew_secs(&self, now_unix: i64) -> i64 {
        now_unix - self.sent_at
    }
}

/// Verifies one delivery: [`check_headers`], then the HMAC over the body.
pub fn verify<S: AsRef<[u8]>>(
    secrets: &[S],
    timestamp: &str,
    body: &[u8],
    signature_header: &str,
    now_unix: i64,
    tolerance_secs: u64,
) -> Result<(), SignatureError> {
    check_headers(timestamp, signature_header, now_unix, tolerance_secs)?.verify(secrets, body)
}

/// Computes the header value Sume would send for these secrets (newest first). Used by tests,
/// the load generator and the Sume simulator.
pub fn sign<S: AsRef<[u8]>>(secrets: &[S], timestamp: &str, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|secret| {
            let mut mac = HmacSha256::new_from_slice(secret.as_ref()).expect("any key length");
            mac.update(timestamp.as_bytes());
            mac.update(b".");
            mac.update(body);
            format!("{SCHEME}{}", hex::encode(mac.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_timestamp(timestamp: &str) -> Result<i64, SignatureError> {
    // Digits only: no sign, no spaces, no fraction. `str::parse` alone would accept "+123".
    if timestamp.is_empty()
        || timestamp.len() > MAX_TIMESTAMP_DIGITS
        || !timestamp.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(SignatureError::MalformedTimestamp);
    }
    timestamp
        .parse()
        .map_err(|_| SignatureError::MalformedTimestamp)
}

/// The decoded digests of the well-formed `sume-v1` entries, at most [`MAX_ENTRIES`] of them.
/// Malformed entries (wrong length, odd or non-hex digits, empty) are skipped, never matched.
fn parse_entries(header: &str) -> Digests {
    let mut digests = Digests {
        entries: [[0; DIGEST_LEN]; MAX_ENTRIES],
        len: 0,
    };
    let well_formed = header
        .split(',')
        .take(MAX_ENTRIES)
        .filter_map(|entry| entry.trim().strip_prefix(SCHEME));
    for hex_digest in well_formed {
        let slot = &mut digests.entries[digests.len];
        if hex::decode_to_slice(hex_digest, slot).is_ok() {
            digests.len += 1;
        } else {
            // decode_to_slice may have written part of it before it found a bad digit.
            *slot = [0; DIGEST_LEN];
        }
    }
    digests
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test_secret";
    const BODY: &[u8] = br#"{"job_id":"job_123","type":"job.completed"}"#;
    const TS: &str = "1767225600";
    const NOW: i64 = 1767225600;

    fn check(timestamp: &str, header: &str) -> Result<(), SignatureError> {
        verify(&[SECRET], timestamp, BODY, header, NOW, 300)
    }

    #[derive(serde::Deserialize)]
    struct Vector {
        name: String,
        secrets: Vec<String>,
        timestamp: String,
        body: String,
        header: String,
        now: i64,
        valid: bool,
    }

    #[test]
    fn shared_vectors() {
        let vectors: Vec<Vector> =
            serde_json::from_str(include_str!("../tests/data/sume-signature-vectors.json"))
                .unwrap();
        assert!(vectors.len() >= 10);
        for v in vectors {
            let result = verify(
                &v.secrets,
                &v.timestamp,
                v.body.as_bytes(),
                &v.header,
                v.now,
                300,
            );
            assert_eq!(result.is_ok(), v.valid, "vector {:?}: {result:?}", v.name);
        }
    }

    #[test]
    fn sign_matches_the_single_secret_vector() {
        assert_eq!(
            sign(&[SECRET], TS, BODY),
            "sume-v1=77732880b975b9a7a0802bd13d4e81841b4e6aec69358259cc7e67c68c54195b"
        );
    }

    #[test]
    fn empty_entries_never_match() {
        assert_eq!(check(TS, "sume-v1="), Err(SignatureError::NoEntries));
        assert_eq!(check(TS, ""), Err(SignatureError::NoEntries));
        assert_eq!(check(TS, ",,, ,"), Err(SignatureError::NoEntries));
        assert_eq!(
            check(TS, "sume-v1=, sume-v1="),
            Err(SignatureError::NoEntries)
        );
    }

    #[test]
    fn empty_secret_never_matches() {
        let header = sign(&[""], TS, BODY);
        assert_eq!(
            verify(&[""], TS, BODY, &header, NOW, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn odd_length_and_non_hex_entries_are_skipped() {
        let good = sign(&[SECRET], TS, BODY);
        let odd = format!("{good}0");
        assert_eq!(check(TS, &odd), Err(SignatureError::NoEntries));
        let non_hex = good.replace("77", "zz");
        assert_eq!(check(TS, &non_hex), Err(SignatureError::NoEntries));
        // A malformed entry next to a good one does not hide the good one.
        assert_eq!(check(TS, &format!("sume-v1=abc, {good}")), Ok(()));
    }

    #[test]
    fn uppercase_hex_is_accepted() {
        let good = sign(&[SECRET], TS, BODY);
        let upper = format!("sume-v1={}", good[SCHEME.len()..].to_uppercase());
        assert_eq!(check(TS, &upper), Ok(()));
    }

    #[test]
    fn extra_spaces_around_entries_are_tolerated() {
        let good = sign(&[SECRET], TS, BODY);
        assert_eq!(check(TS, &format!("   {good}  ,  sume-v1=00 ")), Ok(()));
        // A space inside the digest makes the entry malformed.
        let spaced = good.replacen("=", "= ", 1);
        assert_eq!(check(TS, &spaced), Err(SignatureError::NoEntries));
    }

    #[test]
    fn malformed_timestamps_are_refused() {
        let long = "1".repeat(400);
        for ts in [
            "",
            "+1767225600",
            "-1767225600",
            " 1767225600",
            "1767225600 ",
            "1.5e9",
            &long,
        ] {
            let header = sign(&[SECRET], ts, BODY);
            assert_eq!(
                check(ts, &header),
                Err(SignatureError::MalformedTimestamp),
                "{ts:?}"
            );
        }
    }

    #[test]
    fn timestamps_far_from_now_are_refused_both_ways() {
        for ts in ["0", "999999999999", "1767225299", "1767225901"] {
            let header = sign(&[SECRET], ts, BODY);
            assert_eq!(
                check(ts, &header),
                Err(SignatureError::StaleTimestamp),
                "{ts:?}"
            );
        }
    }

    /// The console shows which secret verifies deliveries (a rotation's progress) and the skew.
    #[test]
    fn verification_says_which_secret_matched_and_the_skew() {
        let header = sign(&["whsec_old"], TS, BODY);
        let signed = check_headers(TS, &header, NOW, 300).unwrap();
        assert_eq!(
            signed.verify_which(&["whsec_new", "whsec_old"], BODY),
            Ok(1)
        );
        assert_eq!(
            signed.verify_which(&["whsec_old", "whsec_new"], BODY),
            Ok(0)
        );
        assert_eq!(
            signed.verify_which(&["whsec_new"], BODY),
            Err(SignatureError::Mismatch)
        );
        let sent: i64 = TS.parse().unwrap();
        assert_eq!(signed.skew_secs(NOW), NOW - sent);
    }

    #[test]
    fn entries_past_the_cap_are_ignored() {
        let good = sign(&[SECRET], TS, BODY);
        let padding = ["sume-v1=00"; MAX_ENTRIES].join(",");
        assert_eq!(
            check(TS, &format!("{padding},{good}")),
            Err(SignatureError::NoEntries)
        );
        let padding = ["sume-v1=00"; MAX_ENTRIES - 1].join(",");
        assert_eq!(check(TS, &format!("{padding},{good}")), Ok(()));
    }

    #[test]
    fn any_configured_secret_may_match() {
        let header = sign(&["whsec_new"], TS, BODY);
        assert_eq!(
            verify(&["whsec_old", "whsec_new"], TS, BODY, &header, NOW, 300),
            Ok(())
        );
    }
}
