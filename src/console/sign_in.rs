//! The console's doors open to strangers and its own sessions: sign-in (throttled per peer,
//! never locked for the right token by another's failures), sign-out, sign-out everywhere, and CSP reports.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::http::{form_value, page, read_form, redirect, text};
use super::pages::{self, Viewer};
use super::session::{Cookie, SESSION_LIFETIME};
use super::{Console, CSP_REPORTS_KEPT, CSP_REPORTS_PER_PEER};
use crate::access::Identity;
use crate::metrics::METRICS;

impl Console {
    /// Checks the peer's throttle before reading the form: a throttled peer's body is never
    /// read. A wrong token makes this peer (only) wait longer.
    pub(super) async fn sign_in(
        &self,
        body: Incoming,
        peer: SocketAddr,
        jar: Cookie,
    ) -> Response<Full<Bytes>> {
        if let Err(wait) = self.sign_ins.check(peer.ip()) {
            let message = format!(
                "Too many failed sign-ins from your address: wait {} s.",
                wait.as_secs().max(1)
            );
            let mut response = page(
                StatusCode::TOO_MANY_REQUESTS,
                pages::layout("Sign in", None, false, pages::sign_in(Some(&message))),
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(wait.as_secs().max(1)),
            );
            return response;
        }
        let form = match read_form(body).await {
            Ok(form) => form,
            Err(response) => return *response,
        };
        let token = form_value(&form, "token").unwrap_or_default();
        let Some(who) = self.tokens.identify(token.trim()) else {
            self.sign_ins.failed(peer.ip());
            return page(
                StatusCode::UNAUTHORIZED,
                pages::layout(
                    "Sign in",
                    None,
                    false,
                    pages::sign_in(Some("That token is not one of this receiver's.")),
                ),
            );
        };
        let (role, name) = (who.role, who.name.clone());
        let id = match self.sessions.start(who) {
            Ok(id) => id,
            Err(error) => {
                tracing::error!(%error, "cannot start a console session");
                return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot start a session");
            }
        };
        tracing::info!(%peer, role = role.label(), name = name.as_deref().unwrap_or("-"), "console sign-in");
        let mut response = redirect("/console/");
        response
            .headers_mut()
            .insert(header::SET_COOKIE, jar.set(&id, SESSION_LIFETIME));
        response
    }

    pub(super) fn sign_out(&self, session: Option<&str>, jar: Cookie) -> Response<Full<Bytes>> {
        if let Some(id) = session {
            self.sessions.end(id);
        }
        let mut response = redirect("/console/sign-in");
        response
            .headers_mut()
            .insert(header::SET_COOKIE, jar.set("", Duration::ZERO));
        response
    }

    /// Ends every session of the token this one signed in with (a lost laptop, a token
    /// shown to the wrong person before it is changed).
    pub(super) fn sign_out_everywhere(
        &self,
        who: &Identity,
        viewer: &Viewer,
        jar: Cookie,
    ) -> Response<Full<Bytes>> {
        let ended = self.sessions.end_everywhere(who);
        tracing::info!(
            role = who.role.label(),
            name = who.name.as_deref().unwrap_or("-"),
            ended,
            "console: signed out everywhere"
        );
        let mut response = page(
            StatusCode::OK,
            pages::layout(
                "Signed out",
                Some(viewer),
                false,
                pages::done(
                    &format!("{ended} sessions of this token ended, this one included."),
                    "/console/sign-in",
                ),
            ),
        );
        response
            .headers_mut()
            .insert(header::SET_COOKIE, jar.set("", Duration::ZERO));
        response
    }

    /// Keeps the report (at most [`CSP_REPORTS_PER_PEER`] of each peer), counted in
    /// `sume_console_csp_reports_total`. When the list is full the report pushed out is the
    /// oldest of the peer that holds the most: a few addresses (IPv6 /64s) posting their fill
    /// push out only each other's, never every other address's.
    pub(super) async fn csp_report(
        &self,
        body: Incoming,
        peer: SocketAddr,
    ) -> Response<Full<Bytes>> {
        let body = match read_form(body).await {
            Ok(body) => body,
            Err(response) => return *response,
        };
        METRICS.record_csp_report();
        // An IPv6 peer is its /64, where every address costs nothing.
        let from = crate::connections::peer_key(peer.ip());
        let mut reports = self.csp_reports.lock().expect("not poisoned");
        let of_peer = reports
            .iter()
            .filter(|(held_by, _)| *held_by == from)
            .count();
        let pushed_out = if of_peer >= CSP_REPORTS_PER_PEER {
            Some(from)
        } else if reports.len() >= CSP_REPORTS_KEPT {
            holding_most(&reports)
        } else {
            None
        };
        if let Some(pushed_out) = pushed_out {
            let oldest = reports
                .iter()
                .position(|(held_by, _)| *held_by == pushed_out);
            reports.remove(oldest.expect("the peer holds some"));
        }
        reports.push_back((from, body.chars().take(2048).collect()));
        tracing::debug!("console: a Content-Security-Policy violation was reported");
        text(StatusCode::NO_CONTENT, "")
    }
}

/// The peer holding the most reports; of those tied, the one whose oldest report is oldest.
fn holding_most(reports: &VecDeque<(IpAddr, String)>) -> Option<IpAddr> {
    let mut held: Vec<(IpAddr, usize)> = Vec::new();
    for (from, _) in reports {
        match held.iter_mut().find(|(peer, _)| peer == from) {
            Some((_, count)) => *count += 1,
            None => held.push((*from, 1)),
        }
    }
    // `held` is in the order of each peer's oldest report: the first of the most wins a tie.
    held.iter()
        .rev()
        .max_by_key(|(_, count)| *count)
        .map(|(peer, _)| *peer)
}
