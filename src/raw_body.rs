//! A delivery's body exactly as it arrived: known to be UTF-8, stored verbatim.
//!
//! The body of a webhook usually arrives in one piece, a slice of the connection's read buffer;
//! keeping that slice instead of copying it into a `String` saves an allocation and a copy of
//! every body on the request path, and the free of that copy on the ledger's writer thread.
//! The slice keeps its read buffer (at most `server.max_header_bytes`, one per connection) until
//! the claim is written; a body in several pieces is joined into a buffer of its own.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

/// UTF-8 bytes, checked once when made.
#[derive(Clone, PartialEq, Eq)]
pub struct RawBody(Bytes);

impl RawBody {
    pub fn from_utf8(bytes: Bytes) -> Result<RawBody, std::str::Utf8Error> {
        std::str::from_utf8(&bytes)?;
        Ok(RawBody(bytes))
    }

    pub fn as_str(&self) -> &str {
        // SAFETY: `from_utf8` and the `From` impls are the only ways to make one, and each
        // holds UTF-8; `Bytes` is immutable.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }
}

impl Deref for RawBody {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for RawBody {
    fn from(text: String) -> RawBody {
        RawBody(Bytes::from(text))
    }
}

impl From<&'static str> for RawBody {
    fn from(text: &'static str) -> RawBody {
        RawBody(Bytes::from_static(text.as_bytes()))
    }
}

impl fmt::Debug for RawBody {
    fn fmt(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), formatter)
    }
}

impl PartialEq<&str> for RawBody {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_utf8() {
        assert!(RawBody::from_utf8(Bytes::from_static(&[0xff, 0xfe])).is_err());
        let body = RawBody::from_utf8(Bytes::from_static("{\"job_id\":\"é\"}".as_bytes()));
        assert_eq!(body.unwrap(), "{\"job_id\":\"é\"}");
    }

    #[test]
    fn keeps_the_bytes_it_was_given_without_copying() {
        let received = Bytes::from(b"{\"job_id\":\"a\"}".to_vec());
        let body = RawBody::from_utf8(received.clone()).unwrap();
        assert_eq!(body.as_str().as_ptr(), received.as_ptr());
    }
}
