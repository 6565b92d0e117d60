//! The console's HTTP pieces: security headers, cookies, forms, and plain answers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use maud::Markup;

use super::{CONTENT_SECURITY_POLICY, FORM_BYTES, FORM_READ_TIMEOUT};
use crate::job_id::JobId;
use crate::paced_body::Paced;
use crate::response::{html_response, text_response};

/// An answer that ends a request early (boxed: it is large, and the rare path).
pub type Refused = Box<Response<Full<Bytes>>>;

/// Headers on every console answer.
pub(super) fn secure(headers: &mut HeaderMap) {
    let set = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

/// A POST from one of the console's own pages: the browser says so (`Sec-Fetch-Site`), or
/// its `Origin` is this console's (`https://` where it is reached over TLS).
pub(super) fn same_origin(headers: &HeaderMap, host: &str, tls: bool) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site == "same-origin";
    }
    headers
        .get(header::ORIGIN)
        .and_then(|origin| origin.to_str().ok())
        .is_some_and(|origin| {
            let scheme = if tls { "https" } else { "http" };
            origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
        })
}

/// A form within [`FORM_READ_TIMEOUT`], at the minimum rate after its first second.
pub(super) async fn read_form(body: Incoming) -> Result<String, Box<Response<Full<Bytes>>>> {
    let body = Paced::new(body, FORM_READ_TIMEOUT);
    match Limited::new(body, FORM_BYTES).collect().await {
        Ok(collected) => Ok(String::from_utf8_lossy(&collected.to_bytes()).into_owned()),
        Err(error) if error.is::<LengthLimitError>() => Err(Box::new(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "a form is at most 8 KiB",
        ))),
        Err(_) => Err(Box::new(text(
            StatusCode::REQUEST_TIMEOUT,
            "the form did not arrive in time",
        ))),
    }
}

/// The value of `name` in a query string or an urlencoded form, decoded.
pub fn form_value(text: &str, name: &str) -> Option<String> {
    text.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| {
            percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

pub(super) fn decode(segment: &str) -> Result<JobId, Refused> {
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
    JobId::parse(&decoded).map_err(|error| refuse(StatusCode::BAD_REQUEST, &error.to_string()))
}

pub(super) fn page(status: StatusCode, markup: Markup) -> Response<Full<Bytes>> {
    html_response(status, markup.into_string())
}

pub(super) fn text(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    text_response(status, message)
}

pub(super) fn refuse(status: StatusCode, message: &str) -> Refused {
    Box::new(text(status, message))
}

pub(super) fn redirect(to: &'static str) -> Response<Full<Bytes>> {
    let mut response = text(StatusCode::SEE_OTHER, "");
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    response
}

pub(super) fn unavailable(error: &crate::ledger::StorageError) -> Response<Full<Bytes>> {
    tracing::warn!(%error, "a console page found the ledger unavailable");
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the ledger is unavailable; try again",
    )
}
