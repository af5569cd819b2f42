{{/* "true" when the DaemonSet runs the compute-domain.nvidia.com plugin container:
computeDomains.enabled (the controller's switch, default true) and
computeDomains.plugin.enabled. */}}
{{- define "dra-driver.computeDomainPlugin" -}}
{{- $cd := .Values.computeDomains | default dict -}}
{{- $plugin := $cd.plugin | default dict -}}
{{- if and (or (not (hasKey $cd "enabled")) $cd.enabled) (or (not (hasKey $plugin "enabled")) $plugin.enabled) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when that plugin also keeps nvidia.com/gpu.clique on its node
(computeDomains.plugin.cliqueNodeLabel, default true; false where GFD sets it). */}}
{{- define "dra-driver.cliqueNodeLabel" -}}
{{- $plugin := (.Values.computeDomains | default dict).plugin | default dict -}}
{{- if and (include "dra-driver.computeDomainPlugin" .) (or (not (hasKey $plugin "cliqueNodeLabel")) $plugin.cliqueNodeLabel) -}}
true
{{- end -}}
{{- end -}}
