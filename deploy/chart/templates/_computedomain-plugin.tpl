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
