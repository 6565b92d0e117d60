//! Properties of the signature check over random inputs (proptest): it never panics, accepts
//! every genuine signature, and refuses any single-byte change to what was signed.

use proptest::prelude::*;
use sume_receiver::signature::{self, MAX_ENTRIES};

const NOW: i64 = 1_767_225_600;
const TOLERANCE: u64 = 300;

fn secret() -> impl Strategy<Value = String> {
    "[!-~]{1,64}"
}

/// A timestamp within the tolerance of NOW.
fn fresh_timestamp() -> impl Strategy<Value = String> {
    (-(TOLERANCE as i64)..=TOLERANCE as i64).prop_map(|offset| (NOW + offset).to_string())
}

/// `bytes` with the byte at `position` replaced, or `None` when that changes nothing.
fn with_byte_changed(
    bytes: &[u8],
    position: prop::sample::Index,
    replacement: u8,
) -> Option<Vec<u8>> {
    let mut changed = bytes.to_vec();
    let at = position.index(changed.len());
    (changed[at] != replacement).then(|| {
        changed[at] = replacement;
        changed
    })
}

fn hex_digit_value(c: u8) -> u8 {
    (c as char).to_digit(16).expect("a hex digit") as u8
}

proptest! {
    #[test]
    fn random_headers_never_panic(
        timestamp in any::<String>(),
        header in any::<String>(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        now in any::<i64>(),
        tolerance in any::<u64>(),
    ) {
        let _ = signature::verify(&["whsec_a"], &timestamp, &body, &header, now, tolerance);
    }

    #[test]
    fn structured_random_headers_never_panic(
        entries in proptest::collection::vec("(sume-v1=|sume-v2=|)[0-9a-fA-F =,]{0,80}", 0..20),
        timestamp in "[0-9+ -]{0,20}",
    ) {
        let header = entries.join(",");
        let _ = signature::verify(&["whsec_a"], &timestamp, b"{}", &header, NOW, TOLERANCE);
    }

    #[test]
    fn a_genuine_signature_always_verifies(
        signing in secret(),
        others in proptest::collection::vec(secret(), 0..3),
        timestamp in fresh_timestamp(),
        body in proptest::collection::vec(any::<u8>(), 0..2048),
        junk in proptest::collection::vec("sume-v1=[0-9a-f]{64}", 0..(MAX_ENTRIES - 1)),
    ) {
        let genuine = signature::sign(&[&signing], &timestamp, &body);
        // Rotation: other entries before ours, and our secret among others.
        let header = junk.iter().cloned().chain([genuine]).collect::<Vec<_>>().join(", ");
        let mut configured = others.clone();
        configured.push(signing);
        prop_assert_eq!(
            signature::verify(&configured, &timestamp, &body, &header, NOW, TOLERANCE),
            Ok(())
        );
    }

    #[test]
    fn any_single_byte_change_to_the_body_fails(
        signing in secret(),
        timestamp in fresh_timestamp(),
        body in proptest::collection::vec(any::<u8>(), 1..512),
        position in any::<prop::sample::Index>(),
        replacement in any::<u8>(),
    ) {
        let header = signature::sign(&[&signing], &timestamp, &body);
        let changed = with_byte_changed(&body, position, replacement);
        prop_assume!(changed.is_some());
        let changed = changed.unwrap();
        prop_assert!(
            signature::verify(&[&signing], &timestamp, &changed, &header, NOW, TOLERANCE).is_err()
        );
    }

    #[test]
    fn any_single_byte_change_to_the_timestamp_fails(
        signing in secret(),
        timestamp in fresh_timestamp(),
        body in proptest::collection::vec(any::<u8>(), 0..512),
        position in any::<prop::sample::Index>(),
        replacement in any::<u8>(),
    ) {
        let header = signature::sign(&[&signing], &timestamp, &body);
        let changed = with_byte_changed(timestamp.as_bytes(), position, replacement);
        prop_assume!(changed.is_some());
        let changed = String::from_utf8_lossy(&changed.unwrap()).into_owned();
        prop_assert!(
            signature::verify(&[&signing], &changed, &body, &header, NOW, TOLERANCE).is_err()
        );
    }

    #[test]
    fn any_single_byte_change_to_the_signature_fails(
        signing in secret(),
        timestamp in fresh_timestamp(),
        body in proptest::collection::vec(any::<u8>(), 0..512),
        position in any::<prop::sample::Index>(),
        replacement in any::<u8>(),
    ) {
        let header = signature::sign(&[&signing], &timestamp, &body);
        let original = header.as_bytes()[position.index(header.len())];
        // A hex digit in the other case is the same byte of the digest, not a change.
        let same_digit = original.is_ascii_hexdigit()
            && replacement.is_ascii_hexdigit()
            && hex_digit_value(original) == hex_digit_value(replacement);
        let changed = with_byte_changed(header.as_bytes(), position, replacement);
        prop_assume!(changed.is_some() && !same_digit);
        let changed = String::from_utf8_lossy(&changed.unwrap()).into_owned();
        prop_assert!(
            signature::verify(&[&signing], &timestamp, &body, &changed, NOW, TOLERANCE).is_err()
        );
    }
}
