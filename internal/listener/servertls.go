package listener

import "crypto/tls"

// ServerTLS is the TLS configuration every muster server starts from (the
// authority's listeners, discovery's, and the bench's model of the
// authority's handshake), given the application protocols it speaks; the
// caller adds its certificate and client-certificate policy.
//
// It sends no session tickets, so no connection is resumed: a resumed
// connection carries the certificates of the handshake that issued its
// ticket without a CertificateVerify of its own, so the client would not
// prove again that it holds the certificate's key, and the checks a
// server makes per handshake would rest on a ticket it sealed up to 7 days
// before. muster's clients keep no session cache and never resume; a
// client that does (OpenSSL's, or Go's with a ClientSessionCache) would
// otherwise be sent a NewSessionTicket after every handshake, its
// certificates sealed inside, for nothing.
//
// Its records are as large as what the server writes at once (up to 16
// KiB), not grown from one TCP segment's size over the connection's first
// writes (dynamic record sizing, for browsers that render a page while it
// arrives): a gRPC response is read whole before it is used, and was
// split in two or more records, each its own write(2).
func ServerTLS(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS12,
		NextProtos:                  nextProtos,
		SessionTicketsDisabled:      true,
		DynamicRecordSizingDisabled: true,
	}
}
