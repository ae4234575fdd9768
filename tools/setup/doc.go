// Package setup holds the tests of setup.sh, the set-up that `make test` and
// `make demo` run first (see the script's header for what it installs).
package setup
