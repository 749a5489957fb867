// Prometheus text exposition (format 0.0.4) of the scheduler's ServiceStats. Pure function; thread-safe.
#pragma once

#include <string>

#include "scheduler/engine_service.h"
#include "server/image_queue.h"
#include "server/image_service.h"

namespace kestrel::server {

std::string prometheus_text(const ServiceStats& s, bool ready);
// One sample with its HELP and TYPE lines; a histogram from upper bounds and cumulative counts.
void metric(std::string& out, const char* name, const char* type, const char* help, double v);
void histogram(std::string& out, const char* name, const char* help, const std::vector<double>& bounds,
               const std::vector<int64_t>& counts, double sum, int64_t n);
// kestrel_images_* / kestrel_image_*: the image path (server/image_service.h) and its worker pool
// (server/image_queue.h).
std::string prometheus_image_text(const ImageMetrics& m, const ImageQueueMetrics& q);

}  // namespace kestrel::server
