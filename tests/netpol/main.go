// netpol-eval asks an upstream implementation of NetworkPolicy semantics, the matcher of
// github.com/mattfenwick/cyclonus (the engine of `cyclonus analyze`, now developed as
// policy-assistant in sigs.k8s.io/network-policy-api), whether connections are allowed.
//
// No CNI on the test machines enforces NetworkPolicy, so tests/integration/test_netpol.py
// feeds the policies our builders produce through this engine instead of through a
// hand-written evaluator of our own, which would share our misreadings of the API.
//
// stdin:  {"policies": [NetworkPolicy, ...], "traffic": [matcher.Traffic, ...]}
//
//	Policies are API objects (JSON, camelCase); traffic uses the engine's own
//	Traffic type, the format of `cyclonus analyze --mode query-traffic --traffic-path`.
//	Unknown fields are an error, so a misspelt key cannot silently mean "no rule".
//
// stdout: one result per traffic, in order:
//
//	{"allowed": bool,
//	 "ingress": {"allowed": bool, "allowedBy": ["ns/name", ...], "deniedBy": [...]},
//	 "egress":  {...}}
//
// allowedBy names the policies selecting the target pod that allow the connection,
// deniedBy those that select it without allowing it.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	networkingv1 "k8s.io/api/networking/v1"
)

type input struct {
	Policies []json.RawMessage `json:"policies"`
	Traffic  []json.RawMessage `json:"traffic"`
}

type direction struct {
	Allowed   bool     `json:"allowed"`
	AllowedBy []string `json:"allowedBy"`
	DeniedBy  []string `json:"deniedBy"`
}

type result struct {
	Allowed bool      `json:"allowed"`
	Ingress direction `json:"ingress"`
	Egress  direction `json:"egress"`
}

func strict(raw []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

func names(targets []*matcher.Target) []string {
	out := []string{}
	for _, t := range targets {
		for _, p := range t.SourceRules {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	sort.Strings(out)
	return out
}

func explain(d *matcher.DirectionResult) direction {
	return direction{Allowed: d.IsAllowed(), AllowedBy: names(d.AllowingTargets), DeniedBy: names(d.DenyingTargets)}
}

func run() error {
	raw, err := os.ReadFile("/dev/stdin")
	if err != nil {
		return err
	}
	var in input
	if err := strict(raw, &in); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	policies := make([]*networkingv1.NetworkPolicy, len(in.Policies))
	for i, p := range in.Policies {
		policies[i] = &networkingv1.NetworkPolicy{}
		if err := strict(p, policies[i]); err != nil {
			return fmt.Errorf("policy %d: %w", i, err)
		}
	}
	// Simplified as `cyclonus analyze` does by default; simplifying keeps the semantics.
	engine := matcher.BuildNetworkPolicies(true, policies)
	results := make([]result, len(in.Traffic))
	for i, t := range in.Traffic {
		var traffic matcher.Traffic
		if err := strict(t, &traffic); err != nil {
			return fmt.Errorf("traffic %d: %w", i, err)
		}
		if traffic.Source == nil || traffic.Destination == nil {
			return fmt.Errorf("traffic %d: Source and Destination are required", i)
		}
		r := engine.IsTrafficAllowed(&traffic)
		results[i] = result{Allowed: r.IsAllowed(), Ingress: explain(r.Ingress), Egress: explain(r.Egress)}
	}
	return json.NewEncoder(os.Stdout).Encode(results)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "netpol-eval:", err)
		os.Exit(2)
	}
}
