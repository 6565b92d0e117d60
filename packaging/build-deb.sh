#!/usr/bin/env bash
# Builds the Debian package: target/debian/sume-receiver_<version>-1_<arch>.deb
#
#   packaging/build-deb.sh     needs a Rust toolchain (rustup) and cargo-deb
#                              (`cargo install cargo-deb --locked`, once)
#
# The man page and shell completions are generated from the binary's own command-line
# definitions, so they always match it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
generated=target/generated
mkdir -p "$generated"
bin="${CARGO_TARGET_DIR:-target}/release/sume-receiver"
"$bin" generate man > "$generated/sume-receiver.1"
"$bin" generate completions bash > "$generated/sume-receiver.bash"
"$bin" generate completions zsh > "$generated/_sume-receiver"
"$bin" generate completions fish > "$generated/sume-receiver.fish"
cargo deb --no-build --locked --strip "$@"
