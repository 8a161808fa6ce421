package relay

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
)

// newProxy forwards a request under /api/ to api unchanged: method, path,
// query, headers (Authorization included), body and the answer's status
// and headers, streamed. Errors are logged without the request's headers,
// so that the token stays out of the log.
func newProxy(api *url.URL, log *slog.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(api)
			r.Out.Host = api.Host
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("relay: REST pass-through failed", "method", r.Method, "path", r.URL.Path, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}
