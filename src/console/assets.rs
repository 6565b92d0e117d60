//! The console's stylesheet and script, compiled into the binary and served under names that
//! hold a hash of their content: a browser may keep them forever, and a new build's are new.

use std::sync::LazyLock;

use sha2::{Digest, Sha256};

pub struct Asset {
    pub content: &'static str,
    pub content_type: &'static str,
    url: LazyLock<String>,
}

impl Asset {
    /// `/console/assets/<stem>.<hash>.<extension>`
    pub fn url(&self) -> &str {
        &self.url
    }
}

fn hashed(stem: &str, extension: &str, content: &str) -> String {
    let digest = hex::encode(&Sha256::digest(content.as_bytes())[..8]);
    format!("/console/assets/{stem}.{digest}.{extension}")
}

const CSS_TEXT: &str = include_str!("assets/console.css");
const JS_TEXT: &str = include_str!("assets/console.js");

pub static CSS: Asset = Asset {
    content: CSS_TEXT,
    content_type: "text/css; charset=utf-8",
    url: LazyLock::new(|| hashed("console", "css", CSS_TEXT)),
};

pub static JS: Asset = Asset {
    content: JS_TEXT,
    content_type: "text/javascript; charset=utf-8",
    url: LazyLock::new(|| hashed("console", "js", JS_TEXT)),
};

/// The asset a path names, if any.
pub fn find(path: &str) -> Option<&'static Asset> {
    [&CSS, &JS].into_iter().find(|asset| asset.url() == path)
}
