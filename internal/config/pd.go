package config

import (
	"fmt"
	"net/url"
	"slices"

	"kvrouter/internal/pd"
)

// Engine roles of disaggregated serving (Engine.Role).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// FleetName is e's name, or its URL's host:port when unnamed: the name
// the fleet, metrics and x-kvrouter-replica know it by.
func (e Engine) FleetName() string {
	if e.Name != "" {
		return e.Name
	}
	if u, err := url.Parse(e.URL); err == nil && u.Host != "" {
		return u.Host
	}
	return e.URL
}

// validatePD checks model i's roles and pd rule.
func validatePD(m Model, i int) []error {
	var errs []error
	var roles []string
	for j, e := range m.Engines {
		switch e.Role {
		case "", RolePrefill, RoleDecode:
			roles = append(roles, e.Role)
		default:
			errs = append(errs, ferr(fmt.Sprintf("%q: want prefill, decode or empty", e.Role), "models", i, "engines", j, "role"))
		}
	}
	hasRoles := slices.ContainsFunc(roles, func(r string) bool { return r != "" })
	if m.Discovery != nil {
		if m.PD != (pd.Rule{}) && m.Discovery.RoleLabel == RoleLabelOff {
			errs = append(errs, ferr("pd is set but discovery.role_label is off", "models", i, "pd"))
		} else if _, err := m.PD.WithDefaults(); err != nil {
			errs = append(errs, ferr(err.Error(), "models", i, "pd"))
		}
		return errs
	}
	if !hasRoles {
		if m.PD != (pd.Rule{}) {
			errs = append(errs, ferr("pd is set but no engine has a role (prefill or decode)", "models", i, "pd"))
		}
		return errs
	}
	if !slices.Contains(roles, RolePrefill) || !slices.Contains(roles, RoleDecode) {
		errs = append(errs, ferr("engines with roles need at least one prefill and one decode engine", "models", i, "engines"))
	}
	if _, err := m.PD.WithDefaults(); err != nil {
		errs = append(errs, ferr(err.Error(), "models", i, "pd"))
	}
	return errs
}
