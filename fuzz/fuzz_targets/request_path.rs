//! The request path without I/O: header checks, body limit, signature, payload parsing.
//!
//! Input layout: one flag byte, then header lines (`name: value`, `\n`-separated) up to an empty
//! line, then the body. With the flag's low bit set, the body is signed genuinely (timestamp
//! `NOW - flag/2`), so the fuzzer also gets past the signature into the payload parser.
#![no_main]

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use sume_receiver::ingest::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use sume_receiver::job_id::JobId;
use sume_receiver::signature;

const SECRET: &str = "whsec_fuzz";
const NOW: i64 = 1_767_225_600;
const MAX_BODY: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (head, body) = match rest.windows(2).position(|pair| pair == b"\n\n") {
        Some(end) => (&rest[..end], &rest[end + 2..]),
        None => (rest, &[][..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&byte| byte == b'\n') {
        let Some(colon) = line.iter().position(|&byte| byte == b':') else {
            continue;
        };
        let value = line[colon + 1..].trim_ascii();
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    if flags & 1 == 1 {
        let timestamp = (NOW - i64::from(flags >> 1)).to_string();
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        let signed = signature::sign(&[SECRET], &timestamp, body);
        headers.append(SIGNATURE_HEADER, signed.parse().unwrap());
    }
    if let Ok(claim) = ingest::check_delivery(&headers, body, &[SECRET], NOW, 300, MAX_BODY) {
        // What passes is stored verbatim under a valid id.
        assert_eq!(claim.body.as_bytes(), body);
        assert_eq!(JobId::parse(claim.job_id.as_str()).as_ref(), Ok(&claim.job_id));
    }
});
