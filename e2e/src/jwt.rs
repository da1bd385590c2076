//! What a ServiceAccount token says about itself: the claims of a JWT's payload, read without verifying
//! the signature (the API server verifies it; a benchmark only wants to know when the token it watches was
//! issued, when it expires and which credential id the audit log will name it by).

use serde_json::Value;

/// The claims of a bound ServiceAccount token that tell it apart and bound its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds.
    pub exp: i64,
    /// The token's id: the audit log's `authentication.kubernetes.io/credential-id` is `JTI=<jti>`.
    pub jti: String,
    /// `sub`, e.g. `system:serviceaccount:kube-system:netcm`.
    pub sub: String,
    /// The pod the token is bound to (`kubernetes.io.pod.name`), if any.
    pub pod: Option<String>,
}

impl Claims {
    /// The credential id the API server records for requests made with this token.
    pub fn credential_id(&self) -> String {
        format!("JTI={}", self.jti)
    }

    /// The token's lifetime in seconds.
    pub fn lifetime(&self) -> i64 {
        self.exp - self.iat
    }
}

/// The claims of `token` (`header.payload.signature`), or what is missing.
pub fn claims(token: &str) -> Result<Claims, String> {
    let payload = payload(token)?;
    let number = |k: &str| {
        payload[k]
            .as_i64()
            .ok_or_else(|| format!("the token's payload has no numeric {k}: {payload}"))
    };
    let text = |k: &str| {
        payload[k]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("the token's payload has no {k}: {payload}"))
    };
    Ok(Claims {
        iat: number("iat")?,
        exp: number("exp")?,
        jti: text("jti")?,
        sub: text("sub")?,
        pod: payload["kubernetes.io"]["pod"]["name"]
            .as_str()
            .map(String::from),
    })
}

/// The JSON payload of a JWT (its second dot-separated part, base64url without padding).
pub fn payload(token: &str) -> Result<Value, String> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    if parts.len() != 3 {
        return Err(format!(
            "not a JWT: {} dot-separated parts, want 3",
            parts.len()
        ));
    }
    let bytes = base64url(parts[1])?;
    serde_json::from_slice(&bytes).map_err(|e| format!("the JWT payload is not JSON: {e}"))
}

/// Decodes base64url (RFC 4648 §5), padding optional.
pub fn base64url(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return Err(format!("{:?} is not base64url", c as char)),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return Err(format!("{} characters cannot be base64url", text.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_decodes_every_remainder_with_and_without_padding() {
        assert_eq!(base64url("").unwrap(), b"");
        assert_eq!(base64url("Zg").unwrap(), b"f");
        assert_eq!(base64url("Zg==").unwrap(), b"f");
        assert_eq!(base64url("Zm8").unwrap(), b"fo");
        assert_eq!(base64url("Zm9v").unwrap(), b"foo");
        // The two characters base64url differs in: 0xfb 0xff → "-_8".
        assert_eq!(base64url("-_8").unwrap(), [0xfb, 0xff]);
        assert!(base64url("Zm9v+").is_err());
        assert!(base64url("Z").is_err());
    }

    #[test]
    fn a_bound_service_account_tokens_claims_are_read_from_its_payload() {
        // The payload of a token the API server issued for a projected volume (signature cut short).
        let payload = r#"{"aud":["https://kubernetes.default.svc"],"exp":1795700000,"iat":1795699400,"iss":"https://kubernetes.default.svc","jti":"0b8f7c1e-5a77-4a4c-9d0e-3c0f1b2a4d5e","kubernetes.io":{"namespace":"kube-system","node":{"name":"ncm-n1","uid":"n"},"pod":{"name":"netcm-5d9c-abcde","uid":"p"},"serviceaccount":{"name":"netcm","uid":"s"}},"nbf":1795699400,"sub":"system:serviceaccount:kube-system:netcm"}"#;
        let token = format!("eyJhbGciOiJSUzI1NiJ9.{}.c2ln", encode(payload.as_bytes()));
        let c = claims(&token).unwrap();
        assert_eq!(c.iat, 1795699400);
        assert_eq!(c.exp, 1795700000);
        assert_eq!(c.lifetime(), 600);
        assert_eq!(
            c.credential_id(),
            "JTI=0b8f7c1e-5a77-4a4c-9d0e-3c0f1b2a4d5e"
        );
        assert_eq!(c.sub, "system:serviceaccount:kube-system:netcm");
        assert_eq!(c.pod.as_deref(), Some("netcm-5d9c-abcde"));
        assert!(claims("only.two").is_err());
        assert!(claims(&format!("a.{}.c", encode(b"{\"iat\":1}"))).is_err());
    }

    /// base64url without padding, the test's side of the round trip.
    fn encode(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }
}
