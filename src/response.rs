//! The HTTP answers every listener builds: a body with its status and type, as JSON, an error, text or a page.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::Serialize;

/// `body` with `status` and the `Content-Type` `content_type`.
pub fn typed(
    status: StatusCode,
    body: impl Into<Bytes>,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub fn json_response(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).expect("a JSON value or a plain struct serializes");
    typed(status, body, "application/json")
}

/// `{"error": message}`: how the webhook listener and the admin API refuse.
pub fn error_response(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json_response(status, &serde_json::json!({ "error": message }))
}

pub fn text_response(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    typed(status, message.to_owned(), "text/plain; charset=utf-8")
}

pub fn html_response(status: StatusCode, html: String) -> Response<Full<Bytes>> {
    typed(status, html, "text/html; charset=utf-8")
}
