// Package e2e holds floodgate's end-to-end tests that need more than the
// library does: a real browser (Chromium, driven with chromedp) against
// the floodgate binary's dashboard. It is a module of its own so that the
// library's go.mod does not require the browser driver; its go.mod points
// at the library in the directory above with a replace directive.
package e2e
