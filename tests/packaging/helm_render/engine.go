package main

// Rendering: every template of the chart parsed into one text/template set (so that any file's
// `define` is visible to every other), then each non-partial file executed with the top-level
// object, as Helm's engine does. The functions are sprig's text functions less env/expandenv,
// plus the ones Helm adds (include, tpl, required, lookup, toYaml and friends).

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"
)

// A template may include itself (recursion) up to this depth before rendering fails.
const maxIncludeDepth = 1000

// noValue is what text/template prints for a missing value even with missingkey=zero (the zero
// value of interface{}); Helm removes it from every rendered file and tpl result.
const noValue = "<no value>"

// renderTemplates returns {template name: rendered text} for every template except partials
// (files whose name starts with "_": they only hold `define`s).
func renderTemplates(chart *loadedChart, top map[string]interface{}) (map[string]string, error) {
	root := template.New("gotpl").Option("missingkey=zero")
	root.Funcs(funcMap(root, map[string]int{}))

	// Parse order decides which of two equal `define`s wins (the last parsed): deeper paths
	// first, then names in reverse order, as Helm parses them.
	templates := append([]chartTemplate{}, chart.Templates...)
	sort.SliceStable(templates, func(i, j int) bool {
		a, b := templates[i].name, templates[j].name
		if da, db := strings.Count(a, "/"), strings.Count(b, "/"); da != db {
			return da > db
		}
		return a > b
	})
	for _, t := range templates {
		if _, err := root.New(t.name).Parse(t.text); err != nil {
			return nil, fmt.Errorf("parse error in %s: %v", t.name, err)
		}
	}

	basePath := path.Join(chart.Metadata.Name, "templates")
	rendered := map[string]string{}
	for _, t := range templates {
		if strings.HasPrefix(path.Base(t.name), "_") {
			continue
		}
		dot := make(map[string]interface{}, len(top)+1)
		for k, v := range top {
			dot[k] = v
		}
		dot["Template"] = map[string]interface{}{"Name": t.name, "BasePath": basePath}
		var out strings.Builder
		if err := root.ExecuteTemplate(&out, t.name, dot); err != nil {
			return nil, explainExecError(t.name, err)
		}
		rendered[t.name] = strings.ReplaceAll(out.String(), noValue, "")
	}
	return rendered, nil
}

// requiredError is the error of `required`: its message is the chart author's, shown alone.
type requiredError struct{ message string }

func (e requiredError) Error() string { return e.message }

// explainExecError shortens an execution error whose cause is `required` (or `fail`-like
// chart messages) to "execution error at (FILE:LINE:COL): MESSAGE", the form Helm prints; other
// errors keep text/template's full message, which names the template and the action.
func explainExecError(name string, err error) error {
	var execErr template.ExecError
	var required requiredError
	if !errors.As(err, &execErr) || !errors.As(err, &required) {
		return fmt.Errorf("rendering %s: %v", name, err)
	}
	// text/template's message: "template: FILE:LINE:COL: executing ..."
	location := name
	if parts := strings.SplitN(execErr.Error(), ": ", 3); len(parts) == 3 {
		location = parts[1]
	}
	return fmt.Errorf("execution error at (%s): %s", location, required.message)
}

func funcMap(t *template.Template, includeDepth map[string]int) template.FuncMap {
	functions := sprig.TxtFuncMap()
	// Helm removes these: a chart's output must not depend on the renderer's environment.
	delete(functions, "env")
	delete(functions, "expandenv")
	helm := template.FuncMap{
		"toYaml":        toYAML,
		"fromYaml":      fromYAML,
		"fromYamlArray": fromYAMLArray,
		"toJson":        toJSON,
		"fromJson":      fromJSON,
		"fromJsonArray": fromJSONArray,
		"required":      required,
		"lookup":        lookup,
		"include":       includeFunc(t, includeDepth),
		"tpl":           tplFunc(t, includeDepth),
	}
	for name, function := range helm {
		functions[name] = function
	}
	return functions
}

// includeFunc is `include NAME DATA`: the named template's output as a string (where
// `template` can only print it), so that it can be piped (| nindent 4).
func includeFunc(t *template.Template, depth map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		if depth[name] >= maxIncludeDepth {
			return "", fmt.Errorf("include %q: nested more than %d deep", name, maxIncludeDepth)
		}
		depth[name]++
		defer func() { depth[name]-- }()
		var out strings.Builder
		err := t.ExecuteTemplate(&out, name, data)
		return out.String(), err
	}
}

// tplFunc is `tpl TEXT DOT`: TEXT rendered as a template that sees every `define` of the chart.
// It parses into a copy of the template set so that a define inside TEXT does not leak.
func tplFunc(parent *template.Template, depth map[string]int) func(string, map[string]interface{}) (string, error) {
	return func(text string, dot map[string]interface{}) (string, error) {
		set, err := parent.Clone()
		if err != nil {
			return "", err
		}
		set.Funcs(template.FuncMap{"include": includeFunc(set, depth), "tpl": tplFunc(set, depth)})
		// Named after the calling template so that errors point at it.
		name := "tpl"
		if current, ok := dot["Template"].(map[string]interface{}); ok {
			if n, ok := current["Name"].(string); ok {
				name = n
			}
		}
		t, err := set.New(name).Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var out strings.Builder
		if err := t.Execute(&out, dot); err != nil {
			return "", fmt.Errorf("tpl: %w", err)
		}
		return strings.ReplaceAll(out.String(), noValue, ""), nil
	}
}

// required fails the render with MESSAGE when the value is missing (nil) or the empty string;
// false and 0 are values.
func required(message string, value interface{}) (interface{}, error) {
	if s, isString := value.(string); value == nil || (isString && s == "") {
		return value, requiredError{message}
	}
	return value, nil
}

// lookup reads a live object in Helm; `helm template` has no cluster and returns an empty map.
func lookup(apiVersion, resource, namespace, name string) (map[string]interface{}, error) {
	return map[string]interface{}{}, nil
}

// toYAML is YAML as kubectl writes it (keys sorted, numbers as JSON has them), without the final
// newline; "" when the value cannot be marshalled.
func toYAML(value interface{}) string {
	data, err := yaml.Marshal(value)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

// fromYAML parses a YAML map; on a parse error the map holds the message under "Error".
func fromYAML(text string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// fromYAMLArray parses a YAML list; on a parse error the list holds the message.
func fromYAMLArray(text string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(text), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(value interface{}) string {
	data, err := json.Marshal(value)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(text string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(text string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(text), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}
